package integration_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// lockGrantedSQL shadows pg_try_advisory_xact_lock(bigint), the key's lock, for sessions
// whose search_path puts public before pg_catalog with a lock that excludes
// nobody: what two coordinators of a Citus cluster see when each takes the
// key's advisory lock on its own node.
const lockGrantedSQL = `
CREATE FUNCTION public.pg_try_advisory_xact_lock(bigint) RETURNS boolean
LANGUAGE sql VOLATILE AS $$ SELECT true $$`

// TestClaimWithLockPerNode plays a duplicate whose advisory lock was taken
// on another node (docs/SCALING.md, Citus): the lock excludes nothing, and
// only the key's row can. A first call claims the key and stops inside fn;
// a second call with the same key follows.
//
//   - The default protocol on a pool (deferredProtocol) writes the key's row
//     only at completion: the second call's fn runs too, and its completion
//     meets the first call's committed row on the primary key, so it fails
//     with ErrKeyLost and its writes roll back. One charge commits; fn ran
//     twice.
//   - insertProtocol (here through an outer transaction) inserts the row at
//     the claim: the second claim waits on the first call's uncommitted row,
//     then replays it. One charge commits; fn ran once.
func TestClaimWithLockPerNode(t *testing.T) {
	for _, path := range []string{"pool", "outer_tx"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := s.pool.Exec(ctx, lockGrantedSQL); err != nil {
				t.Fatal(err)
			}
			cfg := s.pool.Config()
			cfg.ConnConfig.RuntimeParams["search_path"] = "public, pg_catalog"
			nodes, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer nodes.Close()

			var runs atomic.Int64
			// Each run of fn waits for its own release, so that the first
			// call commits before the second completes.
			entered := make(chan struct{}, 2)
			releases := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
			work := func(tx pgx.Tx) (charge, error) {
				n := runs.Add(1)
				c := charge{Amount: 3}
				err := tx.QueryRow(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 3) RETURNING id").Scan(&c.ID)
				entered <- struct{}{}
				select {
				case <-releases[min(n, 2)-1]:
				case <-ctx.Done():
					return c, ctx.Err()
				}
				return c, err
			}
			call := func() (charge, idem.Outcome, error) {
				if path == "pool" {
					return idem.Run(ctx, nodes, "k-node", "h", func(_ context.Context, tx pgx.Tx) (charge, error) { return work(tx) })
				}
				var (
					c       charge
					outcome idem.Outcome
				)
				err := pgx.BeginFunc(ctx, nodes, func(tx pgx.Tx) error {
					var err error
					c, outcome, err = idem.Run(ctx, tx, "k-node", "h", func(_ context.Context, tx pgx.Tx) (charge, error) { return work(tx) })
					return err
				})
				return c, outcome, err
			}
			type answer struct {
				c       charge
				outcome idem.Outcome
				err     error
			}
			first, second := make(chan answer, 1), make(chan answer, 1)
			go func() { c, o, err := call(); first <- answer{c, o, err} }()
			<-entered
			go func() { c, o, err := call(); second <- answer{c, o, err} }()

			if path == "pool" {
				// The second fn runs: nothing but the lock kept it out.
				select {
				case <-entered:
				case <-ctx.Done():
					t.Fatal("the second call never ran fn: did the claim stop taking the (shadowed) lock?")
				}
			} else {
				// The second claim waits on the first call's row.
				waitFor(t, "the second claim to wait on the first call's row", func() bool {
					return s.count(`SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
						WHERE l.locktype = 'transactionid' AND NOT l.granted AND a.datname = current_database()`) > 0
				})
			}
			close(releases[0])
			a := <-first
			close(releases[1])
			b := <-second
			if a.err != nil || a.outcome != idem.OutcomeExecuted {
				t.Fatalf("first call: %v, %v", a.outcome, a.err)
			}
			switch path {
			case "pool":
				if !errors.Is(b.err, idem.ErrKeyLost) || runs.Load() != 2 {
					t.Fatalf("second call: %v, %v; fn ran %d times; want ErrKeyLost after a second run", b.outcome, b.err, runs.Load())
				}
			default:
				if b.err != nil || b.outcome != idem.OutcomeReplayed || b.c != a.c || runs.Load() != 1 {
					t.Fatalf("second call: %+v, %v, %v; fn ran %d times; want a replay of %+v and one run", b.c, b.outcome, b.err, runs.Load(), a.c)
				}
			}
			if n := s.charges(); n != 1 {
				t.Fatalf("%d charges committed; want 1: the key's row decides who commits", n)
			}
		})
	}
}
