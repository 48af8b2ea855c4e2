package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemhq/idem/testkit/testdb"
)

// TestReconcileFindsViolations feeds reconcile a database and answers that
// break each invariant, and checks that it names every break: a checker that
// cannot fail proves nothing.
func TestReconcileFindsViolations(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t)
	if _, err := pool.Exec(ctx, ledgerSQL); err != nil {
		t.Fatal(err)
	}
	p := plan{ops: 6, workers: 1, clients: 1, raceWidth: 1, seed: 1}
	// k-twice committed twice; k-wrong answered another row; k-phantom has a
	// row no call sent; k-lost answered success without a row; k-stuck left
	// its key in progress.
	_, err := pool.Exec(ctx, `
		INSERT INTO ledger (id, idem_key, amount) VALUES
		    (1, 'k-twice', $1), (2, 'k-twice', $1), (3, 'k-wrong', $2), (4, 'k-phantom', 5), (5, 'k-ok', $3)`,
		amountOf("k-twice"), amountOf("k-wrong"), amountOf("k-ok"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `
		INSERT INTO idempotency_keys (idempotency_key, request_hash, status, expires_at) VALUES
		    ('k-twice', 'h', 'completed', now() + interval '1 hour'),
		    ('k-wrong', 'h', 'completed', now() + interval '1 hour'),
		    ('k-phantom', 'h', 'completed', now() + interval '1 hour'),
		    ('k-ok', 'h', 'completed', now() + interval '1 hour'),
		    ('k-stuck', 'h', 'in_progress', now() + interval '1 hour')`)
	if err != nil {
		t.Fatal(err)
	}
	answers := []answer{
		{class: classFresh, key: "k-twice", outcome: "ok", entry: entry{1, amountOf("k-twice")}},
		{class: classFresh, key: "k-wrong", outcome: "ok", entry: entry{99, amountOf("k-wrong")}},
		{class: classFresh, key: "k-lost", outcome: "ok", entry: entry{7, amountOf("k-lost")}},
		{class: classFresh, key: "k-stuck", outcome: "in_progress"},
		{class: classFresh, key: "k-ok", outcome: "ok", entry: entry{5, amountOf("k-ok")}},
		{class: classRetry, key: "k-ok", outcome: "ok", replayed: true, entry: entry{5, amountOf("k-ok")}},
	}
	file := filepath.Join(t.TempDir(), "worker-0.tsv")
	var b strings.Builder
	for _, a := range answers {
		b.WriteString(a.line())
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	fig, err := reconcile(ctx, p, pool.Config().ConnString(), []string{file})
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(fig.violations, "\n")
	for _, want := range []string{
		"key k-twice committed 2 times",
		"key k-wrong: answered {ID:99",
		"ledger row for key k-phantom that no call sent",
		"key k-lost: 1 successful answers, no ledger row",
		"1 keys left in_progress",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no violation %q among:\n%s", want, all)
		}
	}
	if strings.Contains(all, "key k-ok") {
		t.Errorf("k-ok is sound, yet:\n%s", all)
	}
	if fig.executed != 4 || fig.replayed != 1 || fig.inProgress != 1 {
		t.Errorf("executed %d, replayed %d, in progress %d; want 4, 1, 1", fig.executed, fig.replayed, fig.inProgress)
	}
}
