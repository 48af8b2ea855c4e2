package integration_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// gateKey is the advisory lock (bigint form) that holds the second claim of
// TestClaimRaceCommitAfterSnapshot between its snapshot and its lock.
const gateKey = 7306090

// gateSQL shadows pg_try_advisory_xact_lock(bigint), the key's lock, for sessions whose
// search_path puts public before pg_catalog: it first waits for the gate,
// then takes the real lock. The claim statement calls it after its snapshot
// was taken and before it inserts, which is the window of the race.
var gateSQL = fmt.Sprintf(`
CREATE FUNCTION public.pg_try_advisory_xact_lock(bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(%d::bigint);
    RETURN pg_catalog.pg_try_advisory_xact_lock($1);
END $$`, gateKey)

// TestClaimRaceCommitAfterSnapshot plays, deterministically, the one window
// in which fn could run twice: a first call commits the key after a second
// call's claim took its snapshot (so the claim cannot see the row) and
// before that claim takes the key's lock (so the lock is free). With
// claim.sql (an outer transaction) the claim's INSERT then meets the
// committed row, and only the ON CONFLICT … WHERE guard stops it from taking
// the key over; with the deferred protocol (a pool or connection, plain
// table) only assert_deferred.sql's second look, with a snapshot taken after
// the lock, sees it; on the partitioned table, assert_claimed_partitioned.sql.
// The second call must replay the first call's result, fn must have run once.
//
// The second call is held in that window by a gate: its session resolves
// pg_try_advisory_xact_lock to a function that first waits for an advisory
// lock the test holds. The test waits (in pg_locks) until the second claim
// stands at the gate, lets the first call commit, then opens the gate. Every
// step is bounded, so a broken claim fails within seconds. (The gate relies
// on claim.sql calling the function unqualified; were it written
// pg_catalog.pg_try_advisory_xact_lock, this test would fail saying that the
// second claim never stopped, and would need another hook.)
func TestClaimRaceCommitAfterSnapshot(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) { claimRace(t, s, v, "") })
}

// TestClaimRaceSessionRepeatableRead plays the same window for a session
// whose transactions default to REPEATABLE READ, on a pool and a
// connection. The deferred protocol's second look would share the claim's
// snapshot there and miss the first commit: its assertion must send the
// call to claim.sql instead (the protocol is chosen with the session's
// default, learnt with the table's layout), and fn must still run once (the
// second call replays, or fails with a retryable serialization failure).
func TestClaimRaceSessionRepeatableRead(t *testing.T) {
	for _, v := range variants {
		if v.name == "outer_tx" {
			continue // an outer transaction never runs the deferred protocol
		}
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			claimRace(t, newSetup(t), v, "repeatable read")
		})
	}
}

// claimRace is TestClaimRaceCommitAfterSnapshot's body; isolation, when
// set, is the second call's session default.
func claimRace(t *testing.T, s *setup, v variant, isolation string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.pool.Exec(ctx, gateSQL); err != nil {
		t.Fatal(err)
	}
	cfg := s.pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = "public, pg_catalog"
	if isolation != "" {
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = isolation
	}
	gated, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer gated.Close()

	gate, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Release()
	if _, err := gate.Exec(ctx, "SELECT pg_advisory_lock($1::bigint)", gateKey); err != nil {
		t.Fatal(err)
	}
	openGate := func() error {
		_, err := gate.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1::bigint)", gateKey)
		return err
	}

	const key = "k-race"
	var runs atomic.Int64
	work := func(tx pgx.Tx) (charge, error) {
		runs.Add(1)
		c := charge{Amount: 7}
		err := tx.QueryRow(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 7) RETURNING id").Scan(&c.ID)
		return c, err
	}

	// The first call claims the key and stops inside fn.
	entered, release := make(chan struct{}), make(chan struct{})
	releaseFirst := sync.OnceFunc(func() { close(release) })
	type answer struct {
		c   charge
		err error
	}
	firstDone := make(chan answer, 1)
	go func() {
		c, err := idem.Do(ctx, s.pool, key, "h", func(tx pgx.Tx) (charge, error) {
			c, err := work(tx)
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
				return c, ctx.Err()
			}
			return c, err
		})
		firstDone <- answer{c, err}
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		releaseFirst()
		_ = openGate()
		t.Fatal("the first call never entered fn")
	}

	// The director: once the second claim stands at the gate, let the
	// first call commit, then open the gate. It opens the gate on every
	// path, so the second call always returns.
	directed := make(chan error, 1)
	var first answer
	go func() {
		defer releaseFirst()
		err := func() error {
			waitCtx, stop := context.WithTimeout(ctx, 20*time.Second)
			defer stop()
			for {
				var waiting int
				err := s.pool.QueryRow(waitCtx, `SELECT count(*) FROM pg_locks
					WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid = $1 AND objsubid = 1
					  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, gateKey).Scan(&waiting)
				if err != nil {
					return fmt.Errorf("the second claim never stopped between its snapshot and its lock: %w", err)
				}
				if waiting > 0 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			releaseFirst()
			first = <-firstDone
			if first.err != nil {
				return fmt.Errorf("first call: %w", first.err)
			}
			return nil
		}()
		if openErr := openGate(); err == nil {
			err = openErr
		}
		directed <- err
	}()

	var (
		second  charge
		outcome idem.Outcome
		err2    error
	)
	v.with(t, gated, func(db idem.Beginner) {
		second, outcome, err2 = idem.Run(ctx, db, key, "h", func(_ context.Context, tx pgx.Tx) (charge, error) { return work(tx) })
	})
	if err := <-directed; err != nil {
		t.Fatal(err)
	}
	switch {
	case runs.Load() != 1 || s.charges() != 1:
		t.Fatalf("fn ran %d times, %d charges committed (second call: %v, %v): a claim that missed the first commit in its snapshot took the key over (claim.sql's ON CONFLICT … WHERE guard, or the second look of assert_deferred.sql or assert_claimed_partitioned.sql)",
			runs.Load(), s.charges(), outcome, err2)
	case isolation != "" && err2 != nil && idem.Retryable(err2):
		// claim.sql met the row its snapshot could not see: a
		// serialization failure, before fn.
	case err2 != nil || outcome != idem.OutcomeReplayed || second != first.c:
		t.Fatalf("second call: %+v, %v, %v; want a replay of %+v (a claim that lost the race looks the key up again)", second, outcome, err2, first.c)
	}
	if n := s.keys("completed"); n != 1 {
		t.Fatalf("%d completed keys, want 1", n)
	}
}
