package integration_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

var isolationLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

func levelName(iso pgx.TxIsoLevel) string { return strings.ReplaceAll(string(iso), " ", "_") }

// TestIsolationContract checks the contract of Do (replay, mismatch, a key
// in progress, exactly once under a storm on one key, a stored refusal) at
// each isolation level Do can be asked to begin with.
func TestIsolationContract(t *testing.T) {
	for _, iso := range isolationLevels {
		t.Run(levelName(iso), func(t *testing.T) {
			t.Parallel()
			l := newLedger(t)
			pool := l.directPool()
			ctx := context.Background()
			level := idem.WithTxOptions(pgx.TxOptions{IsoLevel: iso})

			t.Run("replay_and_mismatch", func(t *testing.T) {
				var runs atomic.Int64
				work := chargeWork(ctx, "k-replay", 1, 100, &runs)
				first, replayed, err := runReplayed(ctx, pool, "k-replay", ledgerHash, work, level)
				if err != nil || replayed {
					t.Fatalf("first call: %v, replayed %v", err, replayed)
				}
				again, replayed, err := runReplayed(ctx, pool, "k-replay", ledgerHash, work, level)
				if err != nil || !replayed {
					t.Fatalf("second call: %v, replayed %v", err, replayed)
				}
				if _, err := idem.Do(ctx, pool, "k-replay", "another-request", work, level); !errors.Is(err, idem.ErrMismatch) {
					t.Fatalf("another request hash: %v, want ErrMismatch", err)
				}
				if runs.Load() != 1 {
					t.Fatalf("fn ran %d times, want 1", runs.Load())
				}
				l.exactlyOnce("k-replay", 1, 100, first, again)
			})

			t.Run("in_progress", func(t *testing.T) {
				started, release := make(chan struct{}), make(chan struct{})
				work := chargeWork(ctx, "k-busy", 2, 100, nil)
				var first receipt
				var firstErr error
				done := make(chan struct{})
				go func() {
					defer close(done)
					first, firstErr = idem.Do(ctx, pool, "k-busy", ledgerHash, func(tx pgx.Tx) (receipt, error) {
						r, err := work(tx)
						close(started)
						<-release
						return r, err
					}, level)
				}()
				<-started
				_, err := idem.Do(contended(t), pool, "k-busy", ledgerHash, work, level)
				close(release)
				<-done
				if !errors.Is(err, idem.ErrInProgress) || !idem.Retryable(err) {
					t.Fatalf("while the first call runs: %v, want ErrInProgress%s", err, waitedForHolder(err))
				}
				if firstErr != nil {
					t.Fatal(firstErr)
				}
				again, _, replayed := retryKey(t, pool, "k-busy", work)
				if !replayed {
					t.Fatal("the call after the first one ran fn again")
				}
				l.exactlyOnce("k-busy", 2, 100, first, again)
			})

			t.Run("storm", func(t *testing.T) {
				const goroutines = 32
				var runs, calls, inProgress, serialization, refused atomic.Int64
				// The first fn to run holds the key until every other
				// goroutine has been turned away once, so all 32 contend.
				allTurnedAway := make(chan struct{})
				storm, cancel := context.WithTimeout(ctx, stormBound)
				defer cancel()
				charge := chargeWork(storm, "k-storm", 3, 100, &runs)
				work := func(tx pgx.Tx) (receipt, error) {
					r, err := charge(tx)
					if runs.Load() == 1 {
						select {
						case <-allTurnedAway:
						case <-storm.Done():
							return r, errors.New("the other goroutines were not all turned away while the key was held")
						}
					}
					return r, err
				}
				answers := make([]receipt, goroutines)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for g := range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						for attempt := 1; ; attempt++ {
							calls.Add(1)
							r, err := idem.Do(storm, pool, "k-storm", ledgerHash, work, level)
							if err == nil {
								answers[g] = r
								return
							}
							if attempt == 1 && refused.Add(1) == goroutines-1 {
								close(allTurnedAway)
							}
							switch {
							case errors.Is(err, idem.ErrInProgress):
								inProgress.Add(1)
							case pgCode(err) == pgerrcode.SerializationFailure:
								serialization.Add(1)
							}
							if !idem.Retryable(err) || attempt == 10000 || storm.Err() != nil {
								t.Errorf("goroutine %d, call %d: %v%s", g, attempt, err, waitedForHolder(err))
								return
							}
							time.Sleep(time.Millisecond)
						}
					}()
				}
				close(start)
				wg.Wait()
				if t.Failed() {
					return
				}
				l.exactlyOnce("k-storm", 3, 100, answers...)
				t.Logf("%s: %d goroutines, %d calls (%d in progress, %d serialization failures), fn entered %d times, 1 charge committed",
					iso, goroutines, calls.Load(), inProgress.Load(), serialization.Load(), runs.Load())
			})

			t.Run("refusal", func(t *testing.T) {
				var runs atomic.Int64
				refuse := func(tx pgx.Tx) (receipt, error) {
					r, err := chargeWork(ctx, "k-refused", 4, 100, &runs)(tx)
					if err != nil {
						return r, err
					}
					return receipt{}, idem.Refuse("insufficient_funds", "no")
				}
				for i, wantReplay := range []bool{false, true} {
					_, replayed, err := runReplayed(ctx, pool, "k-refused", ledgerHash, refuse, level)
					var refusal *idem.Refusal
					if !errors.As(err, &refusal) || refusal.Code != "insufficient_funds" || idem.Retryable(err) || replayed != wantReplay {
						t.Fatalf("call %d: %v (replayed %v); want the stored refusal", i+1, err, replayed)
					}
				}
				if keyRow, charges := l.committed("k-refused"); !keyRow || charges != 0 || runs.Load() != 1 {
					t.Fatalf("key row %v, %d charges, fn ran %d times; want the refusal stored, its writes rolled back, one run",
						keyRow, charges, runs.Load())
				}
			})
		})
	}
}

// barrier lets n goroutines wait for each other once.
type barrier struct {
	wg   sync.WaitGroup
	done chan struct{}
}

func newBarrier(n int) *barrier {
	b := &barrier{done: make(chan struct{})}
	b.wg.Add(n)
	go func() { b.wg.Wait(); close(b.done) }()
	return b
}

// wait returns once all n arrived, or an error if they do not within a
// minute (a participant failed before reaching it).
func (b *barrier) wait() error {
	b.wg.Done()
	select {
	case <-b.done:
		return nil
	case <-time.After(time.Minute):
		return errors.New("barrier: a participant never arrived")
	}
}

// TestIsolationDeadlock makes fn's own work deadlock: two keys update the
// same two accounts in opposite order. PostgreSQL aborts one transaction;
// Do must surface that as a retryable error that left no key, and a retry
// of that key must succeed exactly once.
func TestIsolationDeadlock(t *testing.T) {
	for _, iso := range isolationLevels {
		t.Run(levelName(iso), func(t *testing.T) {
			t.Parallel()
			l := newLedger(t)
			pool := l.directPool()
			ctx := context.Background()
			level := idem.WithTxOptions(pgx.TxOptions{IsoLevel: iso})
			const amount = 100
			transfer := func(key string, first, second int64, b *barrier) func(pgx.Tx) (receipt, error) {
				return func(tx pgx.Tx) (receipt, error) {
					var r receipt
					// Detect the deadlock quickly; deadlock_timeout is only
					// how long a waiter waits before checking.
					if _, err := tx.Exec(ctx, "set local deadlock_timeout = '50ms'"); err != nil {
						return r, err
					}
					if err := tx.QueryRow(ctx,
						"insert into charges (account_id, amount, idem_key) values ($1, $2, $3) returning id",
						first, amount, key).Scan(&r.ChargeID); err != nil {
						return r, err
					}
					for i, account := range []int64{first, second} {
						if i == 1 && b != nil {
							if err := b.wait(); err != nil {
								return r, err
							}
						}
						if err := tx.QueryRow(ctx,
							"update accounts set balance = balance + $2 where id = $1 returning balance",
							account, amount).Scan(&r.Balance); err != nil {
							return r, err
						}
					}
					return r, nil
				}
			}
			b := newBarrier(2)
			keys := []string{"k-ab", "k-ba"}
			order := [][2]int64{{10, 11}, {11, 10}}
			answers := make([]receipt, 2)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i := range keys {
				wg.Add(1)
				go func() {
					defer wg.Done()
					answers[i], errs[i] = idem.Do(ctx, pool, keys[i], ledgerHash, transfer(keys[i], order[i][0], order[i][1], b), level)
				}()
			}
			wg.Wait()

			failed := 0
			for i, err := range errs {
				if err == nil {
					continue
				}
				failed++
				code := pgCode(err)
				if (code != pgerrcode.DeadlockDetected && code != pgerrcode.SerializationFailure) || !idem.Retryable(err) {
					t.Fatalf("%s: %v (SQLSTATE %q, retryable %v); want a retryable deadlock", keys[i], err, code, idem.Retryable(err))
				}
				definite(t, err)
				l.noTrace(keys[i])
				var replayed bool
				answers[i], _, replayed = retryKey(t, pool, keys[i], transfer(keys[i], order[i][0], order[i][1], nil))
				if replayed {
					t.Fatalf("%s: the retry replayed a call that rolled back", keys[i])
				}
				t.Logf("%s: %s: %v; the retry succeeded", iso, keys[i], err)
			}
			if failed != 1 {
				t.Fatalf("%d transactions failed, want exactly 1 (the deadlock victim)", failed)
			}
			for i, key := range keys {
				var id int64
				if err := l.admin.QueryRow(ctx, "select id from charges where idem_key = $1", key).Scan(&id); err != nil {
					t.Fatalf("%s: %v", key, err) // also fails on two rows
				}
				if answers[i].ChargeID != id {
					t.Fatalf("%s: answered charge %d, committed %d", key, answers[i].ChargeID, id)
				}
			}
			var a, c int64
			if err := l.admin.QueryRow(ctx, "select (select balance from accounts where id = 10), (select balance from accounts where id = 11)").Scan(&a, &c); err != nil {
				t.Fatal(err)
			}
			if a != 2*amount || c != 2*amount || l.inProgress() != 0 {
				t.Fatalf("balances %d and %d, %d keys in progress; want %d each, none", a, c, l.inProgress(), 2*amount)
			}
		})
	}
}

// TestIsolationWriteSkew runs the classic write skew under SERIALIZABLE: two
// keys each take a different doctor off call after both saw three on call.
// PostgreSQL aborts one with a serialization failure; Do must surface it as
// retryable, leave no key, and the retry must succeed exactly once.
func TestIsolationWriteSkew(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	pool := l.directPool()
	ctx := context.Background()
	if _, err := l.admin.Exec(ctx, `
create table doctors (id int primary key, on_call bool not null);
insert into doctors values (1, true), (2, true), (3, true);
create table shift_changes (idem_key text not null, doctor int not null)`); err != nil {
		t.Fatal(err)
	}
	level := idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable})
	offCall := func(key string, doctor int, b *barrier) func(pgx.Tx) (int, error) {
		return func(tx pgx.Tx) (int, error) {
			var n int
			if err := tx.QueryRow(ctx, "select count(*) from doctors where on_call").Scan(&n); err != nil {
				return 0, err
			}
			if b != nil {
				if err := b.wait(); err != nil {
					return 0, err
				}
			}
			if n < 2 {
				return n, idem.Refuse("last_on_call", "someone must stay on call")
			}
			if _, err := tx.Exec(ctx, "update doctors set on_call = false where id = $1", doctor); err != nil {
				return n, err
			}
			_, err := tx.Exec(ctx, "insert into shift_changes values ($1, $2)", key, doctor)
			return n, err
		}
	}
	b := newBarrier(2)
	keys := []string{"k-doctor-1", "k-doctor-2"}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = idem.Do(ctx, pool, keys[i], ledgerHash, offCall(keys[i], i+1, b), level)
		}()
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err == nil {
			continue
		}
		failed++
		first := err
		if pgCode(err) != pgerrcode.SerializationFailure || !idem.Retryable(err) {
			t.Fatalf("%s: %v (retryable %v); want a retryable serialization failure", keys[i], err, idem.Retryable(err))
		}
		definite(t, err)
		l.noTrace(keys[i])
		var replayed bool
		for calls := 1; ; calls++ {
			_, replayed, err = runReplayed(ctx, pool, keys[i], ledgerHash, offCall(keys[i], i+1, nil), level)
			if err == nil {
				break
			}
			if !idem.Retryable(err) || calls == 20 {
				t.Fatalf("%s: retry %d: %v", keys[i], calls, err)
			}
		}
		if replayed {
			t.Fatalf("%s: the retry replayed a call that rolled back", keys[i])
		}
		t.Logf("%s: %v; the retry succeeded", keys[i], first)
	}
	if failed != 1 {
		t.Fatalf("%d transactions failed, want exactly 1", failed)
	}
	var onCall, changes, perKey int
	if err := l.admin.QueryRow(ctx, `select (select count(*) from doctors where on_call),
		(select count(*) from shift_changes), (select count(distinct idem_key) from shift_changes)`).Scan(&onCall, &changes, &perKey); err != nil {
		t.Fatal(err)
	}
	if onCall != 1 || changes != 2 || perKey != 2 || l.inProgress() != 0 {
		t.Fatalf("%d on call, %d shift changes for %d keys, %d keys in progress; want 1, 2, 2, 0", onCall, changes, perKey, l.inProgress())
	}
}

// TestSessionDefaultIsolation: a session whose transactions default to
// REPEATABLE READ or SERIALIZABLE (default_transaction_isolation, as
// ALTER DATABASE or ALTER ROLE can set it) and a call without WithTxOptions.
// The deferred protocol's second look cannot see a race at those levels, so
// its assertion says so and the call claims with claim.sql instead: fn runs
// at the session's level, once per key under a storm, and replays match.
func TestSessionDefaultIsolation(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(levelName(iso), func(t *testing.T) {
			t.Parallel()
			l := newLedger(t)
			pool := l.directPool(func(c *pgxpool.Config) {
				c.ConnConfig.RuntimeParams["default_transaction_isolation"] = string(iso)
				c.MaxConns = 8
			})
			ctx := context.Background()
			var runs atomic.Int64
			for _, key := range []string{"k-1", "k-2"} { // k-2 finds the connection's verdict remembered
				work := chargeWork(ctx, key, 1, 100, &runs)
				var level string
				first, outcome, err := idem.Run(ctx, pool, key, ledgerHash, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
					if err := tx.QueryRow(ctx, "select current_setting('transaction_isolation')").Scan(&level); err != nil {
						return receipt{}, err
					}
					return work(tx)
				})
				if err != nil || outcome != idem.OutcomeExecuted || level != string(iso) {
					t.Fatalf("%s: %v, %v at %q; want executed at %s", key, outcome, err, level, iso)
				}
				again, outcome, err := idem.Run(ctx, pool, key, ledgerHash, func(_ context.Context, tx pgx.Tx) (receipt, error) { return work(tx) })
				if err != nil || outcome != idem.OutcomeReplayed || again != first {
					t.Fatalf("%s again: %+v, %v, %v; want %+v replayed", key, again, outcome, err, first)
				}
			}

			// A storm on one key: one execution, whatever the others get.
			const callers = 8
			var wg sync.WaitGroup
			work := chargeWork(ctx, "k-storm", 1, 100, &runs)
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = idem.Do(ctx, pool, "k-storm", ledgerHash, work)
				}()
			}
			wg.Wait()
			if _, err := idem.Do(ctx, pool, "k-storm", ledgerHash, work, idem.WithWait(10*time.Second)); err != nil {
				t.Fatal(err)
			}
			if got := runs.Load(); got != 3 {
				t.Fatalf("fn ran %d times over 3 keys, want once per key", got)
			}
			for _, key := range []string{"k-1", "k-2", "k-storm"} {
				if keyRow, charges := l.committed(key); !keyRow || charges != 1 {
					t.Fatalf("%s: key row %v, %d charges; want the key and exactly one charge", key, keyRow, charges)
				}
			}
		})
	}
}
