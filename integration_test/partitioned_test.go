package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// partitionedLedger is a ledger whose key table is partitioned by interval.
func partitionedLedger(t *testing.T, interval time.Duration) (*ledger, *pgxpool.Pool) {
	t.Helper()
	l := newLedger(t)
	if err := replaceWithPartitioned(context.Background(), l.admin, "idempotency_keys", interval); err != nil {
		t.Fatal(err)
	}
	return l, l.directPool(func(c *pgxpool.Config) { c.MaxConns = 12 })
}

// partitionsOf returns the names of the key table's partitions.
func partitionsOf(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestPartitionedStormAcrossBoundaries hammers a moving window of keys from
// many goroutines for several one-second partitions, with the sweeper
// making partitions as it goes. New keys start being called at every moment,
// so first attempts race each other on both sides of partition boundaries,
// and keys are retried in later partitions than the one their row is in.
// Every key must have been executed exactly once, and every answer for a key
// must be the committed one.
func TestPartitionedStormAcrossBoundaries(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.Serializable} {
		t.Run(levelName(iso), func(t *testing.T) {
			t.Parallel()
			l, pool := partitionedLedger(t, time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			sweeper, err := idem.NewClient(pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			sweepCtx, stopSweep := context.WithCancel(ctx)
			swept := make(chan error, 1)
			go func() {
				swept <- sweeper.SweepEvery(sweepCtx, 300*time.Millisecond, func(err error) { t.Error(err) })
			}()

			const (
				goroutines = 16
				duration   = 6 * time.Second
				step       = 150 * time.Millisecond // a new key every step
				window     = 4                      // keys called at once
			)
			level := idem.WithTxOptions(pgx.TxOptions{IsoLevel: iso})
			start := time.Now()
			var (
				mu       sync.Mutex
				answers  = map[string][]receipt{}
				calls    atomic.Int64
				runs     atomic.Int64
				retried  atomic.Int64
				accounts = map[string]int64{}
			)
			work := func(key string, account int64) func(pgx.Tx) (receipt, error) {
				charge := chargeWork(ctx, key, account, 1, &runs)
				return func(tx pgx.Tx) (receipt, error) {
					r, err := charge(tx)
					// Some work outlasts a partition boundary.
					time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
					return r, err
				}
			}
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Since(start) < duration && ctx.Err() == nil {
						n := int(time.Since(start)/step) - rand.IntN(window)
						if n < 0 {
							n = 0
						}
						key := fmt.Sprintf("k-%04d", n)
						account := int64(n % 512)
						calls.Add(1)
						r, err := idem.Do(ctx, pool, key, ledgerHash, work(key, account), level)
						switch {
						case err == nil:
							mu.Lock()
							answers[key] = append(answers[key], r)
							accounts[key] = account
							mu.Unlock()
						case errors.Is(err, idem.ErrInProgress), pgCode(err) == pgerrcode.SerializationFailure:
							retried.Add(1)
						default:
							t.Errorf("goroutine %d, %s: %v", g, key, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			stopSweep()
			if err := <-swept; !errors.Is(err, context.Canceled) {
				t.Fatalf("SweepEvery: %v", err)
			}
			if t.Failed() {
				return
			}

			// One charge per key, and every answer is the committed one.
			for key, got := range answers {
				var n int
				var id int64
				if err := l.admin.QueryRow(ctx, "SELECT count(*), coalesce(max(id), 0) FROM charges WHERE idem_key = $1", key).Scan(&n, &id); err != nil {
					t.Fatal(err)
				}
				if n != 1 {
					t.Fatalf("key %s: %d charges committed, want 1", key, n)
				}
				for _, a := range got {
					if a.ChargeID != id {
						t.Fatalf("key %s: answered charge %d, committed %d", key, a.ChargeID, id)
					}
				}
			}
			var keys, rows, partitions, crossed int
			if err := l.admin.QueryRow(ctx, `
				SELECT count(DISTINCT idempotency_key), count(*), count(DISTINCT tableoid)
				FROM idempotency_keys`).Scan(&keys, &rows, &partitions); err != nil {
				t.Fatal(err)
			}
			// Keys whose calls went on after the second their row was made in:
			// their retries would land in another partition.
			if err := l.admin.QueryRow(ctx, `
				SELECT count(*) FROM idempotency_keys k
				WHERE date_trunc('second', k.created_at) < date_trunc('second', k.completed_at)
				   OR k.idempotency_key < $1`, fmt.Sprintf("k-%04d", int((duration-time.Second)/step))).Scan(&crossed); err != nil {
				t.Fatal(err)
			}
			var charges int
			if err := l.admin.QueryRow(ctx, "SELECT count(*) FROM charges").Scan(&charges); err != nil {
				t.Fatal(err)
			}
			if keys != len(answers) || rows != keys || charges != keys || l.inProgress() != 0 {
				t.Fatalf("%d keys answered, %d key rows of %d keys, %d charges, %d in progress", len(answers), rows, keys, charges, l.inProgress())
			}
			if partitions < 3 {
				t.Fatalf("the keys landed in %d partitions; the test must cross boundaries", partitions)
			}
			t.Logf("%s: %d calls over %v, %d keys in %d partitions, fn entered %d times, %d in progress or serialization failures, %d keys retried past their second",
				iso, calls.Load(), duration, keys, partitions, runs.Load(), retried.Load(), crossed)
		})
	}
}

// TestPartitionedSerializableStaleSnapshot makes the race that the
// partitioned layout's unique key cannot catch, deterministically: a
// SERIALIZABLE transaction takes its snapshot, another SERIALIZABLE call
// executes the key and commits, and only then does the first transaction
// call Do with the key. Its snapshot cannot see the committed row, the key's
// lock is free, and the row it inserts lands beside the first one: only
// serializable snapshot isolation stands between it and a second execution.
// It must end in a serialization failure, and a retry must replay.
func TestPartitionedSerializableStaleSnapshot(t *testing.T) {
	t.Parallel()
	l, pool := partitionedLedger(t, time.Second)
	ctx := context.Background()
	serializable := pgx.TxOptions{IsoLevel: pgx.Serializable}
	var runs atomic.Int64
	work := chargeWork(ctx, "k-stale", 7, 100, &runs)

	outer, err := pool.BeginTx(ctx, serializable)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Rollback(ctx)
	var n int
	if err := outer.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys").Scan(&n); err != nil {
		t.Fatal(err)
	}
	// A partition boundary between the two attempts, so that the second row
	// would land in another partition than the first.
	time.Sleep(1100 * time.Millisecond)

	first, err := idem.Do(ctx, pool, "k-stale", ledgerHash, work, idem.WithTxOptions(serializable))
	if err != nil {
		t.Fatal(err)
	}
	_, err = idem.Do(ctx, outer, "k-stale", ledgerHash, work)
	if err == nil {
		err = outer.Commit(ctx)
	}
	if pgCode(err) != pgerrcode.SerializationFailure || !idem.Retryable(err) {
		t.Fatalf("the stale attempt: %v (SQLSTATE %q); want a retryable serialization failure", err, pgCode(err))
	}
	again, _, replayed := retryKey(t, pool, "k-stale", work)
	if !replayed {
		t.Fatal("the retry ran fn again")
	}
	l.exactlyOnce("k-stale", 7, 100, first, again)
	t.Logf("fn entered %d times, 1 charge committed; the stale attempt failed with %v", runs.Load(), err)
}

// TestPartitionedReadCommittedOuterTransaction is the same sequence at READ
// COMMITTED: each statement sees what committed before it, so the late
// call replays the first one's result.
func TestPartitionedReadCommittedOuterTransaction(t *testing.T) {
	t.Parallel()
	l, pool := partitionedLedger(t, time.Second)
	ctx := context.Background()
	work := chargeWork(ctx, "k-rc", 8, 100, nil)
	outer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Rollback(ctx)
	if _, err := outer.Exec(ctx, "SELECT count(*) FROM idempotency_keys"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	first, err := idem.Do(ctx, pool, "k-rc", ledgerHash, work)
	if err != nil {
		t.Fatal(err)
	}
	again, replayed, err := runReplayed(ctx, outer, "k-rc", ledgerHash, work)
	if err != nil || !replayed {
		t.Fatalf("late call in the outer transaction: %v, replayed %v", err, replayed)
	}
	if err := outer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	l.exactlyOnce("k-rc", 8, 100, first, again)
}

// TestPartitionedRepeatableReadRefused: at REPEATABLE READ nothing would
// catch a first attempt committed between the snapshot and the key's lock,
// so Do refuses the combination before fn runs, however the level was set,
// and leaves no trace.
func TestPartitionedRepeatableReadRefused(t *testing.T) {
	t.Parallel()
	l, pool := partitionedLedger(t, time.Second)
	ctx := context.Background()
	var runs atomic.Int64
	work := chargeWork(ctx, "k-rr", 9, 100, &runs)
	check := func(how string, err error) {
		t.Helper()
		if !errors.Is(err, idem.ErrInvalidOption) || idem.Retryable(err) {
			t.Fatalf("%s: %v; want ErrInvalidOption, not retryable", how, err)
		}
	}
	_, outcome, err := idem.Run(ctx, pool, "k-rr", ledgerHash, func(_ context.Context, tx pgx.Tx) (receipt, error) { return work(tx) },
		idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.RepeatableRead}))
	check("WithTxOptions", err)
	if outcome != idem.OutcomeInvalid {
		t.Fatalf("outcome %v, want invalid", outcome)
	}

	outer, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	_, err = idem.Do(ctx, outer, "k-rr", ledgerHash, work)
	check("outer transaction", err)
	if err := outer.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	rr := l.directPool(func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	})
	_, err = idem.Do(ctx, rr, "k-rr", ledgerHash, work)
	check("server default", err)

	if runs.Load() != 0 {
		t.Fatalf("fn ran %d times", runs.Load())
	}
	l.noTrace("k-rr")
	// The plain table takes the same level: its unique key catches the race.
	if _, err := idem.Do(ctx, pool, "k-rr", ledgerHash, work); err != nil {
		t.Fatalf("at READ COMMITTED: %v", err)
	}
}

// TestPartitionedSecondLook checks the statement that keeps a live key
// unique across partitions: a transaction that claimed a key (its row in
// progress) while another transaction's live row of the key is visible must
// fail assert_claimed, so that the claim is undone and the call replays.
func TestPartitionedSecondLook(t *testing.T) {
	t.Parallel()
	_, pool := partitionedLedger(t, time.Second)
	ctx := context.Background()
	if _, err := idem.Do(ctx, pool, "k-look", "h", func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	assert := readSQL(t, "../idem/sql/assert_claimed_partitioned.sql")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The row a claim that did not see the live one would have inserted.
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, request_hash, created_at, expires_at)
		VALUES ('', 'k-look', 'h', clock_timestamp(), clock_timestamp() + interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	var v int
	err = tx.QueryRow(ctx, assert, "", "k-look").Scan(&v)
	if pgCode(err) != pgerrcode.DivisionByZero {
		t.Fatalf("assert_claimed with a live row beside the claim: %v (%d); want division by zero", err, v)
	}
}

// readSQL reads one of idem's SQL files.
func readSQL(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
