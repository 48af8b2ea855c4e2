package integration_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// TestFnEndsTransaction sends the statements that end a transaction through
// the pgx.Tx that fn receives, whose Commit and Rollback methods are guarded
// but whose Exec is not. The call must fail with ErrTxEnded and store no key:
// a key row committed on its own, after fn's work rolled back, would replay
// a charge that never happened; a row stored outside the claim's transaction
// is not the key's guarantee.
//
// make test runs every ending under each protocol of tx.go: on the plain
// layout over the outer transaction, and over the pool or the connection
// in turn; on the partitioned layout over each handle in turn (18 of the
// 36). TestFnEndsTransactionLong runs every ending over every handle on
// both layouts.
func TestFnEndsTransaction(t *testing.T) { fnEndsTransaction(t, false) }

// TestFnEndsTransactionLong is TestFnEndsTransaction over every ending,
// layout and handle.
func TestFnEndsTransactionLong(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("every ending on every layout and handle: make test-long runs it (IDEM_TEST_LONG=1)")
	}
	fnEndsTransaction(t, true)
}

func fnEndsTransaction(t *testing.T, all bool) {
	ctx := context.Background()
	type ending struct {
		name string
		sql  []string // sent after fn's charge
		fail bool     // fn returns an error afterwards
		// kept: the charge fn made before ending the transaction commits
		// (COMMIT and END), which idem cannot undo but must report.
		kept bool
	}
	endings := []ending{
		{"commit_then_error", []string{"commit"}, true, true},
		{"end_then_success", []string{"end"}, false, true},
		{"rollback_then_success", []string{"rollback"}, false, false},
		{"abort_then_success", []string{"abort"}, false, false},
		{"commit_begin_then_success", []string{"commit", "begin"}, false, true},
		{"rollback_begin_then_success", []string{"rollback", "begin"}, false, false},
	}
	paths := []string{"pool", "conn", "outer_tx"}
	for _, l := range layouts {
		for pi, path := range paths {
			for ei, e := range endings {
				short := ei%len(paths) == pi // partitioned: each handle in turn
				if l.name == plain.name {
					short = path == "outer_tx" || ei%2 == pi // plain: outer_tx, and pool or conn in turn
				}
				if !all && !short {
					continue
				}
				t.Run(l.name+"/"+path+"/"+e.name, func(t *testing.T) {
					t.Parallel()
					s := newSetupLayout(t, l)
					runs := 0
					work := chargeFn(ctx, 10, &runs)
					fn := func(tx pgx.Tx) (charge, error) {
						c, err := work(tx)
						if err != nil {
							return c, err
						}
						for _, sql := range e.sql {
							if _, err := tx.Exec(ctx, sql); err != nil {
								return c, err
							}
						}
						if e.fail {
							return c, errors.New("declined after the commit")
						}
						return c, nil
					}
					var err error
					switch path {
					case "pool":
						_, err = idem.Do(ctx, s.pool, "k-end", "h", fn)
					case "conn":
						conn, aerr := s.pool.Acquire(ctx)
						if aerr != nil {
							t.Fatal(aerr)
						}
						_, err = idem.Do(ctx, conn.Conn(), "k-end", "h", fn)
						conn.Release()
					case "outer_tx":
						tx, berr := s.pool.Begin(ctx)
						if berr != nil {
							t.Fatal(berr)
						}
						_, err = idem.Do(ctx, tx, "k-end", "h", fn)
						_ = tx.Rollback(ctx)
					}
					if !errors.Is(err, idem.ErrTxEnded) {
						t.Fatalf("Do: %v; want ErrTxEnded", err)
					}
					if idem.Retryable(err) {
						t.Fatalf("%v: a transaction fn ended is a programming error, not retryable", err)
					}
					// An 'in_progress' row that fn's COMMIT made durable (where the
					// claim inserts the row) counts as absent: the next claim
					// replaces it.
					if n := s.count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'k-end' AND status <> 'in_progress'"); n != 0 {
						t.Fatalf("%d key rows stored for a call whose transaction fn ended; want none", n)
					}
					want := 0
					if e.kept {
						want = 1
					}
					if got := s.charges(); got != want {
						t.Fatalf("%d charges committed; want %d (what fn's own %v left)", got, want, e.sql)
					}
				})
			}
		}
	}
}
