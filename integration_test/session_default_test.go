package integration_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// TestSessionDefaultIsolationChanges changes a connection's default
// isolation level after idem learnt it (with the table's layout, on the
// first call). The protocol chosen for READ COMMITTED cannot see a race at
// REPEATABLE READ: its assertion must notice, fail the call before fn runs
// and without a trace of the key, and the next call must learn the new
// default and run.
func TestSessionDefaultIsolationChanges(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	runs := 0
	fn := chargeFn(ctx, 5, &runs)
	if _, err := idem.Do(ctx, conn.Conn(), "k-first", "h", fn); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET default_transaction_isolation = 'repeatable read'"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, "RESET default_transaction_isolation") }()

	_, err = idem.Do(ctx, conn.Conn(), "k-second", "h", fn)
	if err == nil || !strings.Contains(err.Error(), "READ COMMITTED") || runs != 1 {
		t.Fatalf("Do after the default changed: %v, fn ran %d times; want a failure naming the isolation level, before fn", err, runs)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'k-second'"); n != 0 {
		t.Fatalf("%d rows of the failed call's key", n)
	}
	var level string
	if err := conn.QueryRow(ctx, "SHOW transaction_isolation").Scan(&level); err != nil || level != "repeatable read" {
		t.Fatalf("the connection is left at %q (%v), want idle at its new default", level, err)
	}
	again, outcome, err := idem.Run(ctx, conn.Conn(), "k-second", "h", func(_ context.Context, tx pgx.Tx) (charge, error) { return fn(tx) })
	if err != nil || outcome != idem.OutcomeExecuted || runs != 2 {
		t.Fatalf("the next call: %+v, %v, %v, fn ran %d times; want it executed once", again, outcome, err, runs)
	}
	if s.charges() != 2 {
		t.Fatalf("%d charges, want 2", s.charges())
	}
}
