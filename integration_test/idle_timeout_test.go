package integration_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/idem"
)

// TestIdleTimeoutError: fn pauses past Config.IdleTimeout (an external call
// made inside Do), and the server ends the session with a bare FATAL 25P03.
// The error names Config.IdleTimeout and idem.Operation, and stays what it
// was for errors.As and Retryable; nothing committed and a retry runs fn.
// The pause may fall before one of fn's statements or before COMMIT.
func TestIdleTimeoutError(t *testing.T) {
	const idle = 200 * time.Millisecond
	pause := func(ctx context.Context) error {
		// Well past idle, so a loaded server has ended the session.
		select {
		case <-time.After(8 * idle):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	cases := map[string]func(ctx context.Context, tx pgx.Tx) (int, error){
		"before_a_statement": func(ctx context.Context, tx pgx.Tx) (int, error) {
			if err := pause(ctx); err != nil {
				return 0, err
			}
			var n int
			err := tx.QueryRow(ctx, "select 1").Scan(&n)
			return n, err
		},
		"before_commit": func(ctx context.Context, _ pgx.Tx) (int, error) {
			return 1, pause(ctx)
		},
	}
	for name, fn := range cases {
		for _, path := range []string{"pool", "beginner"} {
			t.Run(name+"/"+path, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				s := newSetup(t)
				var db idem.Beginner = s.pool
				if path == "beginner" {
					db = ownBeginner{s.pool}
				}
				base, err := idem.NewClient(s.pool, &idem.Config{IdleTimeout: idle})
				if err != nil {
					t.Fatal(err)
				}
				keys := base.On(db)
				_, outcome, err := idem.Run(ctx, keys, "k-idle", "h", fn)
				if outcome == idem.OutcomeUnknown {
					// The server's FATAL did not arrive before the
					// connection closed: nothing to name.
					t.Skipf("outcome unknown: %v", err)
				}
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.IdleInTransactionSessionTimeout {
					t.Fatalf("err %v (outcome %v); want the server's 25P03 inside", err, outcome)
				}
				for _, want := range []string{"Config.IdleTimeout (200ms)", "idem.Operation"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not name %s", err, want)
					}
				}
				if !idem.Retryable(err) || outcome != idem.OutcomeFailed {
					t.Errorf("Retryable %v, outcome %v; want true and failed", idem.Retryable(err), outcome)
				}
				got, outcome, err := idem.Run(ctx, keys, "k-idle", "h", func(context.Context, pgx.Tx) (int, error) { return 2, nil })
				if err != nil || outcome != idem.OutcomeExecuted || got != 2 {
					t.Fatalf("retry: %v %v %v; want fn run (the first attempt committed nothing)", got, outcome, err)
				}
			})
		}
	}
}

// TestIdleTimeoutErrorOuter: on an outer transaction idem sets no timeout;
// the error names the outer transaction's setting instead.
func TestIdleTimeoutErrorOuter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSetup(t)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "set local idle_in_transaction_session_timeout = '200ms'"); err != nil {
		t.Fatal(err)
	}
	_, err = idem.Do(ctx, tx, "k-outer", "h", func(tx pgx.Tx) (int, error) {
		time.Sleep(1600 * time.Millisecond)
		var n int
		return n, tx.QueryRow(ctx, "select 1").Scan(&n)
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.IdleInTransactionSessionTimeout {
		t.Fatalf("err %v; want the server's 25P03 inside", err)
	}
	if !strings.Contains(err.Error(), "outer transaction's idle_in_transaction_session_timeout") || !idem.Retryable(err) {
		t.Errorf("error %q (Retryable %v): want the outer transaction's setting named, and retryable", err, idem.Retryable(err))
	}
}
