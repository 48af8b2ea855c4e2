package integration_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/internal/sqltext"
	"github.com/idemhq/idem/schema"
	"github.com/idemhq/idem/testkit/testdb"
)

// The embedded schema applies again without harm, on a live table.
func TestSchemaAppliesTwice(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	seedKeys(t, s, 3, 0)
	for i := 0; i < 2; i++ {
		if err := schema.Apply(context.Background(), s.pool); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 3 {
		t.Fatalf("%d keys after re-applying the schema, want 3", n)
	}
}

// Every schema/[0-9]*.sql, applied in order with psql -f (twice), yields the
// table the Go code expects: the same columns as the embedded schema gives.
func TestSchemaFilesWithPsql(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql not installed")
	}
	url := testdb.URL(t)
	// A database without the table: drop it from the fresh clone first.
	if out, err := exec.Command(psql, url, "-v", "ON_ERROR_STOP=1", "-qc", "DROP TABLE idempotency_keys").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	files, _ := filepath.Glob("../schema/[0-9]*.sql")
	var applied []string
	for pass := 0; pass < 2; pass++ {
		for _, f := range files {
			if strings.HasSuffix(f, ".down.sql") {
				continue
			}
			if out, err := exec.Command(psql, url, "-v", "ON_ERROR_STOP=1", "-qf", f).CombinedOutput(); err != nil {
				t.Fatalf("psql -f %s (pass %d): %v: %s", f, pass, err, out)
			}
			applied = append(applied, filepath.Base(f))
		}
	}
	embedded, err := schema.Files()
	if err != nil || len(embedded) == 0 || len(applied) != 2*len(embedded) || embedded[0].Name != applied[0] {
		t.Fatalf("embedded files %v vs applied %v (%v)", embedded, applied, err)
	}
	columns := func(u string) string {
		out, err := exec.Command(psql, u, "-Atc", "SELECT string_agg(column_name || ' ' || data_type, ', ' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_name = 'idempotency_keys'").CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got, want := columns(url), columns(testdb.URL(t)); got != want || got == "" {
		t.Fatalf("psql-applied columns:\n%s\nembedded:\n%s", got, want)
	}
}

// The partitioned layout's files, applied with psql (twice, and with an
// interval from PGOPTIONS), yield a partitioned table with the plain one's
// columns, a DEFAULT partition and one-minute partitions.
func TestPartitionedSchemaFilesWithPsql(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql not installed")
	}
	url := testdb.URL(t)
	run := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command(psql, append([]string{url, "-v", "ON_ERROR_STOP=1", "-q"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("psql %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	columns := func(u string) string {
		out, err := exec.Command(psql, u, "-Atc", "SELECT string_agg(column_name || ' ' || data_type || ' ' || coalesce(column_default, ''), ', ' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_name = 'idempotency_keys'").CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	plainColumns := columns(url)
	run(nil, "-c", "DROP TABLE idempotency_keys")
	files, _ := filepath.Glob("../schema/partitioned/[0-9]*.sql")
	if len(files) != 2 {
		t.Fatalf("schema/partitioned holds %v", files)
	}
	for pass := 0; pass < 2; pass++ {
		for _, f := range files {
			run([]string{"PGOPTIONS=-c idem.partition_interval=60"}, "-f", f)
		}
	}
	if got := columns(url); got != plainColumns {
		t.Fatalf("partitioned columns:\n%s\nplain:\n%s", got, plainColumns)
	}
	got := run(nil, "-Atc", `SELECT count(*) FILTER (WHERE pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'),
		count(*) FILTER (WHERE pg_get_expr(c.relpartbound, c.oid) LIKE 'FOR VALUES FROM%'),
		(SELECT relkind FROM pg_class WHERE oid = 'idempotency_keys'::regclass)
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'idempotency_keys'::regclass`)
	// Each pass makes the present minute's range and three ahead; a second
	// pass that began in the next minute made one more.
	if got != "1|4|p" && got != "1|5|p" {
		t.Fatalf("default|range partitions|relkind = %s, want 1|4|p (or 1|5|p across a minute's end)", got)
	}
	// The files refuse a plain table of the same name.
	run(nil, "-c", "DROP TABLE idempotency_keys", "-c", "CREATE TABLE idempotency_keys (x int)")
	cmd := exec.Command(psql, url, "-v", "ON_ERROR_STOP=1", "-qf", files[1])
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "is not partitioned") {
		t.Fatalf("on a plain table: %v: %s", err, out)
	}
}

// A database that has only schema/001 (the key table) runs Do, and every
// call that needs the operations' tables of schema/002 fails with an error
// that names the table that is missing, not the key table that exists.
func TestSchemaWithoutItsOperationsTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSetup(t)
	files, err := schema.Files()
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := sqltext.ParseTable("only001.keys")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "CREATE SCHEMA only001; "+tbl.Rewrite(files[0].SQL)); err != nil {
		t.Fatal(err)
	}
	client, err := idem.NewClient(s.pool, &idem.Config{Table: "only001.keys"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, client, "k", "h", func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatalf("Do on the key table alone: %v", err)
	}
	_, statsErr := client.Stats(ctx)
	_, forgetErr := client.Forget(ctx, "", "k")
	for name, err := range map[string]error{"Stats": statsErr, "Forget": forgetErr} {
		if err == nil || !strings.Contains(err.Error(), `"only001.keys_operations" does not exist`) && !strings.Contains(err.Error(), `"keys_operations" does not exist`) {
			t.Errorf("%s: %v; want an error naming keys_operations", name, err)
		}
	}
}

// schema.Apply with no database is an error wrapping ErrInvalidOption, as
// every other constructor answers, not a panic.
func TestSchemaApplyNilDatabase(t *testing.T) {
	t.Parallel()
	for _, db := range []schema.Execer{nil, (*pgxpool.Pool)(nil)} {
		if err := schema.Apply(context.Background(), db); !errors.Is(err, idem.ErrInvalidOption) {
			t.Errorf("Apply(%T): %v; want ErrInvalidOption", db, err)
		}
	}
}
