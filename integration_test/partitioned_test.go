package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
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

// TestPartitionedSweep follows keys through the life of their partitions:
// Sweep makes partitions ahead, keeps a partition while any key in it still
// replays (a long TTL, or work that completed long after its claim), does
// not drop a partition under a running claim, deletes expired keys that
// landed in the DEFAULT partition, and drops the rest whole.
func TestPartitionedSweep(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("IDEM_TEST_LONG=1 (make test-long): one-second partitions and a one-second TTL race the clock when make test runs many tests side by side")
	}
	t.Parallel()
	s := newSetupLayout(t, partitioned)
	ctx := context.Background()
	short, err := idem.NewClient(s.pool, &idem.Config{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	long, err := idem.NewClient(s.pool, &idem.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	one := func(pgx.Tx) (int, error) { return 1, nil }
	partitionOf := func(key string) string {
		t.Helper()
		var name string
		if err := s.pool.QueryRow(ctx, "SELECT tableoid::regclass::text FROM idempotency_keys WHERE idempotency_key = $1", key).Scan(&name); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return name
	}
	exists := func(name string) bool {
		t.Helper()
		var ok bool
		if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	// Wait past the partitions ApplyPartitioned made: these keys go to the
	// DEFAULT partition.
	time.Sleep(4 * time.Second)
	// Start just after a second begins, so that these keys, on a loaded
	// machine too, all land in the DEFAULT partition's share of one
	// second's range.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
	for i := range 5 {
		if _, err := idem.Do(ctx, short, fmt.Sprintf("d-%d", i), "h", one); err != nil {
			t.Fatal(err)
		}
	}
	if p := partitionOf("d-0"); p != "idempotency_keys_default" {
		t.Fatalf("d-0 is in %s, want the DEFAULT partition", p)
	}
	var removed int64
	sweep := func() {
		t.Helper()
		n, err := short.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		removed += n
	}
	sweep()
	before := len(partitionsOf(t, s.pool))
	// The DEFAULT partition and those ahead: the present second's range
	// holds the keys above in the DEFAULT partition, and so does the next
	// one's if they spilled into it, so at least two ranges ahead are made.
	if before < 3 {
		t.Fatalf("Sweep made %d partitions (with the DEFAULT one), want those ahead", before)
	}
	// The present second's range holds rows in the DEFAULT partition, so
	// Sweep left it to the DEFAULT partition; the next ones exist.
	time.Sleep(1100 * time.Millisecond)

	if _, err := idem.Do(ctx, long, "long", "h", one); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the others in another partition
	if _, err := idem.Do(ctx, short, "short", "h", one); err != nil {
		t.Fatal(err)
	}
	// Work that completes 3 s after its claim, with a TTL of 1 s: its row's
	// expires_at passes long before the key stops replaying.
	if _, err := idem.Do(ctx, short, "slow", "h", func(pgx.Tx) (int, error) { time.Sleep(3 * time.Second); return 1, nil }); err != nil {
		t.Fatal(err)
	}
	// A claim still running in a partition whose range passes meanwhile.
	sweep() // partitions ahead again
	entered, release, held := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var releaseOnce sync.Once
	releaseHeld := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseHeld)
	go func() {
		_, err := idem.Do(ctx, short, "held", "h", func(pgx.Tx) (int, error) { close(entered); <-release; return 1, nil })
		held <- err
	}()
	<-entered
	pLong, pShort, pSlow := partitionOf("long"), partitionOf("short"), partitionOf("slow")
	if pLong == "idempotency_keys_default" || pSlow == "idempotency_keys_default" {
		t.Fatalf("keys went to the DEFAULT partition after Sweep made partitions: %s %s", pLong, pSlow)
	}
	time.Sleep(2 * time.Second) // "short" and the running claim's ranges pass

	var heldPart string
	for range 3 {
		sweep()
	}
	if err := s.pool.QueryRow(ctx, `SELECT c.oid::regclass::text FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
		WHERE l.pid <> pg_backend_pid() AND l.mode = 'RowExclusiveLock' AND c.relname LIKE 'idempotency_keys_p%' LIMIT 1`).Scan(&heldPart); err != nil {
		t.Fatalf("the running claim's partition: %v", err)
	}
	if !exists(heldPart) {
		t.Fatalf("Sweep dropped %s under a running claim", heldPart)
	}
	releaseHeld()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if _, replayed, err := runReplayed(ctx, short, "held", "h", one); err != nil || !replayed {
		t.Fatalf("the held key after it committed: %v, replayed %v", err, replayed)
	}
	if !exists(pSlow) {
		t.Fatalf("Sweep dropped %s while the slow key still replays", pSlow)
	}

	// Everything short-lived has expired 2 s from now; "long" has not.
	time.Sleep(2 * time.Second)
	sweep()
	if exists(pShort) {
		t.Fatalf("Sweep kept %s, whose keys all expired", pShort)
	}
	if !exists(pLong) {
		t.Fatalf("Sweep dropped %s, which holds a live key", pLong)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys_default"); n != 0 {
		t.Fatalf("%d expired keys left in the DEFAULT partition", n)
	}
	if _, replayed, err := runReplayed(ctx, long, "long", "h", one); err != nil || !replayed {
		t.Fatalf("the long-lived key: %v, replayed %v", err, replayed)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 1 || removed != 8 {
		t.Fatalf("%d keys left, %d removed; want only the long-lived one left, 8 removed", n, removed)
	}
	// On an outer transaction, Sweep only deletes from the DEFAULT
	// partition: it neither makes nor drops partitions there. "late" fills
	// a partition that a sweep on the pool would drop once it expired.
	sweep()
	if _, err := idem.Do(ctx, short, "late", "h", one); err != nil {
		t.Fatal(err)
	}
	pLate := partitionOf("late")
	if pLate == "idempotency_keys_default" {
		t.Fatalf("late went to the DEFAULT partition after Sweep made partitions")
	}
	time.Sleep(2 * time.Second) // "late" expires and its range passes
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// Read through tx: DDL of an uncommitted transaction is invisible to
	// other sessions.
	partitionsInTx := func() []string {
		t.Helper()
		rows, err := tx.Query(ctx, "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass ORDER BY 1")
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	parts := partitionsInTx()
	if n, err := short.On(tx).Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("Sweep in a transaction = %d, %v; want 0 (nothing expired in the DEFAULT partition)", n, err)
	}
	if after := partitionsInTx(); !slices.Equal(after, parts) || !slices.Contains(after, pLate) {
		t.Fatalf("Sweep in a transaction changed the partitions: %v, then %v (%s must stay)", parts, after, pLate)
	}
}

// TestPartitionedLookupAndForget: an expired row and a live one of the same
// key (a key reused after its TTL, in another partition) read back as the
// live one; Forget removes both.
func TestPartitionedLookupAndForget(t *testing.T) {
	t.Parallel()
	s := newSetupLayout(t, partitioned)
	ctx := context.Background()
	keys, err := idem.NewClient(s.pool, &idem.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, keys, "k", "h1", func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "UPDATE idempotency_keys SET expires_at = created_at - interval '2 hours'"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := idem.Do(ctx, keys, "k", "h2", func(pgx.Tx) (int, error) { return 2, nil }); err != nil {
		t.Fatal(err)
	}
	if n := s.count("SELECT count(DISTINCT tableoid) FROM idempotency_keys WHERE idempotency_key = 'k'"); n != 2 {
		t.Fatalf("the two rows of k are in %d partitions, want 2", n)
	}
	rec, err := keys.Lookup(ctx, "", "k")
	if err != nil || rec.RequestHash != "h2" || rec.Status != idem.StatusCompleted {
		t.Fatalf("Lookup: %+v, %v; want the live row (h2)", rec, err)
	}
	if v, err := idem.DecodeResult[int](rec); err != nil || v != 2 {
		t.Fatalf("Lookup's result %d, %v", v, err)
	}
	if ok, err := keys.Forget(ctx, "", "k"); err != nil || !ok {
		t.Fatalf("Forget: %v, %v", ok, err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d rows left after Forget", n)
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
