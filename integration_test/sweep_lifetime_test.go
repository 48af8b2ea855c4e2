package integration_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

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
