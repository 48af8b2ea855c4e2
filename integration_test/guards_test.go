package integration_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// A row left 'in_progress' by a commit it should never have had (fn or an
// operator wrote it; no transaction holds its key) counts as absent: the
// next call runs fn and replaces it in place, on every path.
func TestCommittedInProgressRowIsReplaced(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		if _, err := s.pool.Exec(ctx, `INSERT INTO idempotency_keys
			(scope, idempotency_key, request_hash, status, created_at, expires_at)
			VALUES ('', 'k-left', 'other-hash', 'in_progress', now(), now() + interval '1 day')`); err != nil {
			t.Fatal(err)
		}
		runs := 0
		got, err := do(t, s, v, "k-left", "h", chargeFn(ctx, 3, &runs))
		if err != nil || runs != 1 {
			t.Fatalf("a committed in_progress row: %v, fn ran %d times; want fn to run", err, runs)
		}
		again, err := do(t, s, v, "k-left", "h", chargeFn(ctx, 3, &runs))
		if err != nil || again != got || runs != 1 {
			t.Fatalf("the retry: %+v, %v, runs %d; want a replay of %+v", again, err, runs, got)
		}
		// The plain table replaces the row in place. On the partitioned one
		// the primary key holds created_at, so the claim adds a row beside
		// the stale one, which stays in progress and is never live.
		rows := 1
		if s.layout.name == partitioned.name {
			rows = 2
		}
		if s.count("SELECT count(*) FROM idempotency_keys") != rows || s.keys("completed") != 1 {
			t.Fatalf("%d key rows, %d completed; want %d and 1", s.count("SELECT count(*) FROM idempotency_keys"), s.keys("completed"), rows)
		}
	})
}

// A sealed result copied to another key's row is refused even by a Sealer
// that binds no additional data of its own (xorSealer): the envelope names
// the scope and key it was sealed for.
func TestEnvelopeNamesItsKey(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	keys, err := idem.NewClient(s.pool, &idem.Config{Sealer: xorSealer{}})
	if err != nil {
		t.Fatal(err)
	}
	for key, result := range map[string]string{"alice-order": "alice's receipt", "bob-order": "bob's receipt"} {
		if _, err := idem.Do(ctx, keys, key, "h", func(pgx.Tx) (string, error) { return result, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.pool.Exec(ctx, `UPDATE idempotency_keys AS d SET response = p.response
		FROM idempotency_keys AS p WHERE p.idempotency_key = 'alice-order' AND d.idempotency_key = 'bob-order'`); err != nil {
		t.Fatal(err)
	}
	got, err := idem.Do(ctx, keys, "bob-order", "h", func(pgx.Tx) (string, error) { return "ran again", nil })
	if !errors.Is(err, idem.ErrCorruptRecord) {
		t.Fatalf("bob's key with alice's sealed result: %q, %v; want ErrCorruptRecord", got, err)
	}
	if got, err := idem.Do(ctx, keys, "alice-order", "h", func(pgx.Tx) (string, error) { return "ran again", nil }); err != nil || got != "alice's receipt" {
		t.Fatalf("the untouched key: %q, %v", got, err)
	}
}

// Wrap's stored scope separates the operation from the caller's scope, so
// no two (operation, scope) pairs share keys, however their text splits.
func TestWrapScopesSplitUnambiguously(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	result := func(name string) func(context.Context, pgx.Tx, int) (string, error) {
		return func(context.Context, pgx.Tx, int) (string, error) { return name, nil }
	}
	scoped := func(scope string) context.Context { return idem.ContextWithScope(context.Background(), scope) }
	ab, _, err := idem.Wrap(s.pool, "ab", result("operation ab, scope c"))(scoped("c"), "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	a, outcome, err := idem.Wrap(s.pool, "a", result("operation a, scope bc"))(scoped("bc"), "k", 1)
	if err != nil || a == ab || outcome != idem.OutcomeExecuted {
		t.Fatalf(`Wrap("a") in scope "bc" got %q (%v, %v); Wrap("ab") in scope "c" stored %q`, a, outcome, err, ab)
	}
	x, _ := idem.WrapScope("ab", "c")
	y, _ := idem.WrapScope("a", "bc")
	if x == y {
		t.Fatalf("WrapScope(ab, c) = WrapScope(a, bc) = %q", x)
	}
}
