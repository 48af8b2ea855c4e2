package sqltext

import (
	"strings"
	"testing"
)

func TestParseTable(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"idempotency_keys", "billing.idem_keys", "_k", "k9"} {
		if _, err := ParseTable(ok); err != nil {
			t.Errorf("ParseTable(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Keys", "9k", "a.b.c", "a.", ".a", `"k"`, "k; drop table x", "k-1", strings.Repeat("k", 40), "ü"} {
		if _, err := ParseTable(bad); err == nil {
			t.Errorf("ParseTable(%q) = nil, want an error", bad)
		}
	}
}

func TestRewrite(t *testing.T) {
	t.Parallel()
	sql := "CREATE TABLE idempotency_keys (CONSTRAINT idempotency_keys_pkey PRIMARY KEY (k)); CREATE INDEX idempotency_keys_x ON idempotency_keys (k)"
	tbl, _ := ParseTable("billing.keys")
	want := `CREATE TABLE "billing"."keys" (CONSTRAINT keys_pkey PRIMARY KEY (k)); CREATE INDEX keys_x ON "billing"."keys" (k)`
	if got := tbl.Rewrite(sql); got != want {
		t.Fatalf("Rewrite:\n%s\nwant\n%s", got, want)
	}
	def, _ := ParseTable(DefaultTable)
	if def.Rewrite(sql) != sql {
		t.Fatal("the default table must leave the SQL as it is")
	}
}

func TestRewriteRelations(t *testing.T) {
	tb, err := ParseTable("billing.keys")
	if err != nil {
		t.Fatal(err)
	}
	got := tb.Rewrite("SELECT 1 FROM idempotency_keys_operations JOIN idempotency_keys_steps USING (scope); ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_operations_pkey")
	want := `SELECT 1 FROM "billing"."keys_operations" JOIN "billing"."keys_steps" USING (scope); ALTER TABLE "billing"."keys" ADD CONSTRAINT keys_operations_pkey`
	if got != want {
		t.Fatalf("Rewrite:\n got %s\nwant %s", got, want)
	}
}
