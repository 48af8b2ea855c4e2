package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/testdb"
)

// TestBareDatabaseBesideItsClient checks that a database a Client with
// settings was made on cannot be used bare by mistake: every call given it
// fails with ErrInvalidOption before any database work (nothing is written
// to the default table), an integration refuses it at start-up, and a
// Client with the defaults leaves the database usable bare.
func TestBareDatabaseBesideItsClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)

	if _, err := idem.NewClient(pool, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, pool, "k-default", "h", func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatalf("a database whose only Client has the defaults, given bare: %v", err)
	}

	keys, err := idem.NewClient(pool, &idem.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	fn := func(pgx.Tx) (int, error) { ran++; return 1, nil }
	_, doErr := idem.Do(ctx, pool, "k", "h", fn)
	_, _, runErr := idem.Run(ctx, pool, "k", "h", func(context.Context, pgx.Tx) (int, error) { ran++; return 1, nil })
	_, _, wrapErr := idem.Wrap(pool, "op", func(context.Context, pgx.Tx, int) (int, error) { ran++; return 1, nil })(ctx, "k", 1)
	_, mwErr := idemhttp.NewMiddleware(pool, nil)
	_, obsErr := idem.ObserverOf(pool)
	for name, err := range map[string]error{"Do": doErr, "Run": runErr, "Wrap": wrapErr, "idemhttp.NewMiddleware": mwErr, "ObserverOf": obsErr} {
		if !errors.Is(err, idem.ErrInvalidOption) {
			t.Errorf("%s given the bare pool: %v, want ErrInvalidOption", name, err)
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'k'").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if ran != 0 || rows != 0 {
		t.Fatalf("the bare calls ran fn %d times and stored %d rows, want none", ran, rows)
	}

	// Through the Client, the same call runs, with the Client's TTL.
	if _, err := idem.Do(ctx, keys, "k", "h", fn); err != nil || ran != 1 {
		t.Fatalf("through the Client: ran %d, err %v", ran, err)
	}
	var ttl float64
	if err := pool.QueryRow(ctx, "SELECT extract(epoch FROM expires_at - created_at) FROM idempotency_keys WHERE idempotency_key = 'k'").Scan(&ttl); err != nil {
		t.Fatal(err)
	}
	if ttl != time.Hour.Seconds() {
		t.Fatalf("stored TTL %vs, want the Client's %vs", ttl, time.Hour.Seconds())
	}
}
