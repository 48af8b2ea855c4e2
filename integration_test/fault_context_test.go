package integration_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// cancelOn returns a rule that cancels a context when match selects a
// message, and then answers act for that message.
func cancelOn(match faultproxy.Match, cancel context.CancelFunc, act faultproxy.Action) faultproxy.Rule {
	done := false
	return func(m faultproxy.Message) faultproxy.Action {
		if done || !match(m) {
			return faultproxy.Pass
		}
		done = true
		cancel()
		return act
	}
}

// TestFaultContextCancelled (i) cancels the call's context at each step.
// Where a step must be caught in flight, another session makes the server
// wait (a table or row lock), or the proxy withholds the answer, so the
// cancellation always lands while the step is under way.
func TestFaultContextCancelled(t *testing.T) {
	const account, amount = 1, 100
	for _, c := range []struct {
		name string
		// arm prepares the fault and returns a function that undoes it
		// after the call.
		arm func(l *ledger, cancel context.CancelFunc) (undo func())
		// fn wraps the work, for faults inside fn.
		fn        func(cancel context.CancelFunc, work func(pgx.Tx) (receipt, error)) func(pgx.Tx) (receipt, error)
		committed bool
		unknown   bool
		// sameConn: the connection survives, cleaned up by Do's rollback.
		sameConn bool
	}{
		{
			name: "before_call",
			arm:  func(_ *ledger, cancel context.CancelFunc) func() { cancel(); return func() {} },
			// Nothing is sent: the pool's connection is left as it was.
			sameConn: true,
		},
		{
			name: "during_claim",
			arm: func(l *ledger, cancel context.CancelFunc) func() {
				ctx := context.Background()
				tx, err := l.admin.Begin(ctx)
				if err != nil {
					l.t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, "lock table idempotency_keys in access exclusive mode"); err != nil {
					l.t.Fatal(err)
				}
				l.proxy.SetRule(cancelOn(faultproxy.ClientSQLContains("idempotency_keys"), cancel, faultproxy.Pass))
				return func() { _ = tx.Rollback(ctx) }
			},
		},
		{
			name: "during_fn_in_flight",
			arm: func(l *ledger, cancel context.CancelFunc) func() {
				release := l.holdAccount(account)
				l.proxy.SetRule(cancelOn(faultproxy.ClientSQL("update accounts"), cancel, faultproxy.Pass))
				return release
			},
		},
		{
			name: "during_fn_between_statements",
			fn: func(cancel context.CancelFunc, work func(pgx.Tx) (receipt, error)) func(pgx.Tx) (receipt, error) {
				return func(tx pgx.Tx) (receipt, error) {
					if _, err := tx.Exec(context.Background(), "select 1"); err != nil {
						return receipt{}, err
					}
					cancel()
					return work(tx)
				}
			},
			sameConn: true,
		},
		{
			name: "during_commit_before_server",
			arm: func(l *ledger, cancel context.CancelFunc) func() {
				l.proxy.SetRule(cancelOn(faultproxy.ClientSQL("commit"), cancel, faultproxy.Blackhole))
				return func() {}
			},
			unknown: true,
		},
		{
			name: "during_commit_after_server",
			arm: func(l *ledger, cancel context.CancelFunc) func() {
				l.proxy.SetRule(cancelOn(faultproxy.ServerTag("COMMIT"), cancel, faultproxy.Blackhole))
				return func() {}
			},
			committed: true,
			unknown:   true,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := newLedger(t)
			bg := context.Background()
			const key = "k-cancel"
			pool := l.pool(func(c *pgxpool.Config) { c.MaxConns = 1 })
			if _, err := idem.Do(bg, pool, "k-warm", ledgerHash, chargeWork(bg, "k-warm", 0, 1, nil)); err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			work := chargeWork(ctx, key, account, amount, &runs)
			fn := work
			if c.fn != nil {
				fn = c.fn(cancel, work)
			}
			undo := func() {}
			if c.arm != nil {
				undo = c.arm(l, cancel)
			}
			first, err := idem.Do(ctx, pool, key, ledgerHash, fn)
			l.proxy.SetRule(nil)
			undo()
			if c.unknown {
				// A blackholed connection lingers until a timeout (pgx's
				// close waits for the server to hang up, and the server
				// holds the key until it reads EOF); end the partition.
				l.proxy.CutAll()
			}

			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v; want context.Canceled", err)
			}
			if c.unknown {
				if !errors.Is(err, idem.ErrOutcomeUnknown) {
					t.Fatalf("got %v; want ErrOutcomeUnknown", err)
				}
			} else {
				definite(t, err)
			}
			if c.committed {
				if keyRow, charges := l.committed(key); !keyRow || charges != 1 {
					t.Fatalf("key row %v, %d charges; the COMMIT reached the server", keyRow, charges)
				}
			} else {
				l.noTrace(key)
			}
			conns := l.proxy.Conns()
			again, calls, replayed := retryKey(t, pool, key, chargeWork(bg, key, account, amount, &runs))
			if replayed != c.committed {
				t.Fatalf("retry replayed %v, want %v", replayed, c.committed)
			}
			if c.sameConn && l.proxy.Conns() != conns {
				t.Fatalf("the retry needed a new connection (%d, was %d); the cancelled call should leave its connection clean", l.proxy.Conns(), conns)
			}
			answers := []receipt{again}
			if c.committed && err == nil {
				// A call that failed returns no result, even if its COMMIT
				// landed.
				answers = append(answers, first)
			}
			l.exactlyOnce(key, account, amount, answers...)
			t.Logf("%s: %v; fn entered %d times; settled after %d calls, replayed %v", c.name, err, runs.Load(), calls, replayed)
		})
	}
}
