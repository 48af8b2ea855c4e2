package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/testkit/testdb"
)

// TestReconcileCrashFindsViolations feeds the crash reconciliation a
// database and answers that break each invariant, and checks that it names
// every break.
func TestReconcileCrashFindsViolations(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t)
	if _, err := pool.Exec(ctx, crashSQL); err != nil {
		t.Fatal(err)
	}
	ledger := func(id int64, key string) {
		t.Helper()
		if _, err := pool.Exec(ctx, "INSERT INTO ledger (id, idem_key, account, amount) VALUES ($1, $2, $3, $4)",
			id, key, accountOf(key), amountOf(key)); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "UPDATE accounts SET balance = balance + $2 WHERE id = $1", accountOf(key), amountOf(key)); err != nil {
			t.Fatal(err)
		}
	}
	keyRow := func(key, status string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (idempotency_key, request_hash, status, expires_at)
			VALUES ($1, 'h', $2, now() + interval '1 hour') ON CONFLICT DO NOTHING`, key, status); err != nil {
			t.Fatal(err)
		}
	}
	// k-twice committed twice; k-wrong answered another row; k-phantom has a
	// row no client sent; k-lost answered without a row; k-stuck never
	// answered and left its key in progress; k-ok is right, but a retry of
	// it ran again; k-skewed's account holds more than its operations.
	for id, key := range map[int64]string{1: "k-twice", 2: "k-twice", 3: "k-wrong", 4: "k-phantom", 5: "k-ok", 6: "k-skewed"} {
		ledger(id, key)
		keyRow(key, "completed")
	}
	keyRow("k-stuck", "in_progress")
	if _, err := pool.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = $1", accountOf("k-skewed")); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ok := func(class, key string, id int64, replayed bool) opResult {
		return opResult{class: class, opKey: opKey{key: key}, entry: entry{id, amountOf(key)}, replayed: replayed, attempts: 1,
			start: now.Add(-time.Second), lastStart: now.Add(-time.Second), end: now.Add(-time.Second)}
	}
	results := [][]opResult{{
		ok(classFresh, "k-twice", 1, false),
		ok(classFresh, "k-wrong", 99, false),
		ok(classFresh, "k-lost", 7, false),
		{class: classFresh, opKey: opKey{key: "k-stuck"}, attempts: 3, err: "gave up after 3 attempts"},
		ok(classFresh, "k-ok", 5, false),
		ok(classRetry, "k-ok", 5, false),
		ok(classFresh, "k-skewed", 6, false),
	}}
	records := []faultRecord{
		{fault: fault{kind: "db", percent: 30}, at: now, dead: now, up: now},
		{fault: fault{kind: "app", percent: 50}, at: now, dead: now, up: now, err: errors.New("restart failed")},
	}
	fig := tally(results, records, 3)
	if err := reconcileCrash(ctx, pool.Config().ConnString(), results, fig); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(fig.violations, "\n")
	for _, want := range []string{
		"key k-twice committed 2 times",
		"key k-wrong: answered {ID:99",
		"ledger row for key k-phantom that no client sent",
		"key k-lost: answered 1 times, no ledger row",
		"key k-stuck: never answered",
		"1 keys left in_progress",
		"key k-ok: a retry of a key already answered ran the operation again",
		"balance",
		"fault db@30: no operation was in flight",
		"fault app0@50: restart failed",
		"2 of 3 faults injected",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no violation mentions %q; got:\n%s", want, all)
		}
	}
}

func TestParseFaults(t *testing.T) {
	t.Parallel()
	got, err := parseFaults(defaultFaults, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []fault{{"app", 0, 10}, {"db", 0, 25}, {"apps", 0, 40}, {"all", 0, 55}, {"app", 1, 70}, {"db", 0, 85}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"app2@10", "db@0", "db@100", "db@30,apps@20", "disk@10", "db", "db@x"} {
		if _, err := parseFaults(bad, 2); err == nil {
			t.Errorf("parseFaults(%q) accepted it", bad)
		}
	}
}
