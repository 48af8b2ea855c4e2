package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// seedKeys stores live and expired keys through Do, then ages the expired.
func seedKeys(t *testing.T, s *setup, live, expired int) {
	t.Helper()
	ctx := context.Background()
	fn := func(pgx.Tx) (int, error) { return 1, nil }
	for i := 0; i < live+expired; i++ {
		if _, err := idem.Do(ctx, s.pool, fmt.Sprintf("k%03d", i), "h", fn); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.pool.Exec(ctx, "UPDATE idempotency_keys SET expires_at = now() - interval '1 minute' WHERE idempotency_key < $1", fmt.Sprintf("k%03d", expired)); err != nil {
		t.Fatal(err)
	}
}

func TestSweepDeletesOnlyExpiredInBatches(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	seedKeys(t, s, 5, 23)
	// 23 expired keys in statements of at most 4: Sweep goes on until a
	// batch comes back short.
	sweeper, err := idem.NewClient(s.pool, &idem.Config{SweepBatchSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := sweeper.Sweep(context.Background())
	if err != nil || deleted != 23 {
		t.Fatalf("deleted %d, %v; want 23", deleted, err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 5 {
		t.Fatalf("%d keys left, want the 5 live ones", n)
	}
	if _, err := idem.NewClient(s.pool, &idem.Config{SweepBatchSize: -1}); !errors.Is(err, idem.ErrInvalidOption) {
		t.Fatalf("batch size -1: %v, want ErrInvalidOption", err)
	}
}

func TestSweepEveryRunsUntilCancelled(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	seedKeys(t, s, 2, 10)
	sweeper, err := idem.NewClient(s.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sweeper.SweepEvery(ctx, 10*time.Millisecond, func(err error) { t.Error(err) }) }()
	for deadline := time.Now().Add(time.Minute); s.count("SELECT count(*) FROM idempotency_keys") != 2; {
		if time.Now().After(deadline) {
			t.Fatal("the background sweeper did not delete the expired keys")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("SweepEvery returned %v, want context.Canceled", err)
	}
}

// The sweeper deletes a key once its lifetime is over and never before: a
// key swept early is a key whose retry runs fn again. The lifetime of a
// completed key ends at completed_at + TTL; expires_at (created_at + TTL)
// is only a lower bound, so a key that took long to complete outlives it.
// Keys just inside and just outside their lifetime (a minute either way),
// with a TTL of an hour.
func TestSweepKeepsLiveKeys(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	keys, err := idem.NewClient(s.pool, &idem.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		key string
		// created and completed are ages (before now()); completed < 0: in
		// progress.
		created, completed time.Duration
		swept              bool
	}
	const m = time.Minute
	rows := []row{
		{"expired-long-ago", 3 * time.Hour, 3*time.Hour - m, true},
		{"expired-a-minute-ago", time.Hour + 2*m, time.Hour + m, true},
		{"completes-in-a-minute", time.Hour - m, time.Hour - m, false},      // expires_at: now() + 1 min
		{"completed-late", time.Hour + 30*m, time.Hour - m, false},          // expires_at passed, completed_at + TTL not
		{"completed-late-just-over", time.Hour + 30*m, time.Hour + m, true}, // both passed
		{"fresh", m, m, false},                             // expires in 59 min
		{"in-progress-left-over", time.Hour + m, -1, true}, // committed by misuse, long dead
		{"in-progress-recent", 2 * m, -1, false},           // committed by misuse, within its TTL
	}
	micros := func(d time.Duration) int64 {
		if d < 0 {
			return -1
		}
		return d.Microseconds()
	}
	for _, r := range rows {
		if _, err := idem.Do(ctx, keys, r.key, "h", func(pgx.Tx) (string, error) { return "first " + r.key, nil }); err != nil {
			t.Fatal(err)
		}
		_, err := s.pool.Exec(ctx, `UPDATE idempotency_keys
			SET created_at   = now() - $2::bigint * interval '1 microsecond',
			    expires_at   = now() - $2::bigint * interval '1 microsecond' + interval '1 hour',
			    completed_at = CASE WHEN $3::bigint < 0 THEN NULL ELSE now() - $3::bigint * interval '1 microsecond' END,
			    status       = CASE WHEN $3::bigint < 0 THEN 'in_progress' ELSE status END
			WHERE idempotency_key = $1`, r.key, micros(r.created), micros(r.completed))
		if err != nil {
			t.Fatal(err)
		}
	}
	deleted, err := keys.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, r := range rows {
		if r.swept {
			want++
		}
		left := s.count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1", r.key) == 1
		if left == r.swept {
			completed := fmt.Sprintf("completed %v ago", r.completed)
			if r.completed < 0 {
				completed = "in progress"
			}
			t.Errorf("%s (created %v ago, %s, TTL 1h): swept %v, want %v", r.key, r.created, completed, !left, r.swept)
		}
	}
	if deleted != int64(want) {
		t.Errorf("Sweep deleted %d keys, want %d", deleted, want)
	}
	// Every completed key that was kept still replays; every swept one runs
	// fn afresh.
	for _, r := range rows {
		if r.completed < 0 {
			continue
		}
		got, outcome, err := idem.Run(ctx, keys, r.key, "h", func(context.Context, pgx.Tx) (string, error) { return "again " + r.key, nil })
		wantOutcome, wantGot := idem.OutcomeReplayed, "first "+r.key
		if r.swept {
			wantOutcome, wantGot = idem.OutcomeExecuted, "again "+r.key
		}
		if err != nil || outcome != wantOutcome || got != wantGot {
			t.Errorf("%s after the sweep: %q, %v, %v; want %q, %v", r.key, got, outcome, err, wantGot, wantOutcome)
		}
	}
}

// The sweeper never waits for a call that is claiming an expired key anew,
// and the call's result survives the sweep. With claim.sql (REPEATABLE READ
// or SERIALIZABLE here) the claim has replaced the expired row, uncommitted,
// and the sweep steps over it (SKIP LOCKED); with the deferred protocol (READ
// COMMITTED) the claim wrote nothing, the sweep deletes the expired row, and
// the completion inserts the key's row anew.
func TestSweepSkipsKeysBeingClaimed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		opts        []idem.Option
		wantDeleted int64
	}{
		{"deferred", nil, 1},
		{"claim", []idem.Option{idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable})}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
			ctx := context.Background()
			if _, err := idem.Do(ctx, s.pool, "k", "h", func(pgx.Tx) (int, error) { return 1, nil }, tc.opts...); err != nil {
				t.Fatal(err)
			}
			if _, err := s.pool.Exec(ctx, "UPDATE idempotency_keys SET created_at = created_at - interval '2 days', expires_at = expires_at - interval '2 days', completed_at = completed_at - interval '2 days'"); err != nil {
				t.Fatal(err)
			}
			release, releaseHolder := holderRelease(t)
			entered := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := idem.Do(ctx, s.pool, "k", "h", func(pgx.Tx) (int, error) { close(entered); <-release; return 2, nil }, tc.opts...)
				done <- err
			}()
			select {
			case <-entered:
			case err := <-done:
				t.Fatalf("the claim of the expired key: %v", err)
			}

			sweeper, err := idem.NewClient(s.pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			deleted, err := sweeper.Sweep(bounded)
			releaseHolder()
			if errors.Is(err, context.DeadlineExceeded) || bounded.Err() != nil {
				t.Fatalf("Sweep waited for the claim's transaction until its deadline (%v): it must skip locked rows", err)
			}
			if err != nil || deleted != tc.wantDeleted {
				t.Fatalf("Sweep = %d, %v; want %d deleted", deleted, err, tc.wantDeleted)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got, err := idem.Do(ctx, s.pool, "k", "h", func(pgx.Tx) (int, error) { return 3, nil }, tc.opts...)
			if err != nil || got != 2 {
				t.Fatalf("after the claim committed: %d, %v; want its result 2 replayed", got, err)
			}
		})
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

	// Partitions ahead again before each key below: a loaded machine may
	// have stalled past those the last sweep made.
	sweep()
	if _, err := idem.Do(ctx, long, "long", "h", one); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the others in another partition
	sweep()
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
