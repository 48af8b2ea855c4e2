package citus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// charge is the business result the tests store and replay.
type charge struct {
	ID      int64 `json:"id"`
	Balance int64 `json:"balance"`
}

// chargeFn charges scope's account amount and records the charge under
// ref, counting its runs.
func chargeFn(ctx context.Context, scope, ref string, amount int64, runs *int) func(pgx.Tx) (charge, error) {
	return func(tx pgx.Tx) (charge, error) {
		*runs++
		var c charge
		err := tx.QueryRow(ctx, `UPDATE accounts SET balance = balance - $2
		                          WHERE scope = $1 AND id = 1 AND balance >= $2 RETURNING balance`,
			scope, amount).Scan(&c.Balance)
		if errors.Is(err, pgx.ErrNoRows) {
			return c, idem.Refuse("insufficient_funds", "not enough money")
		}
		if err != nil {
			return c, err
		}
		err = tx.QueryRow(ctx, `INSERT INTO charges (scope, ref, amount) VALUES ($1, $2, $3) RETURNING id`,
			scope, ref, amount).Scan(&c.ID)
		return c, err
	}
}

// A transport is how a call reaches the database: the pipeline of a pool,
// or an outer transaction (Do in a savepoint of it).
type transport struct {
	name string
	do   func(ctx context.Context, pool idem.Beginner, key, hash string, fn func(pgx.Tx) (charge, error)) (charge, error)
}

var transports = []transport{
	{"pool", func(ctx context.Context, db idem.Beginner, key, hash string, fn func(pgx.Tx) (charge, error)) (charge, error) {
		return idem.Do(ctx, db, key, hash, fn)
	}},
	{"outer_tx", func(ctx context.Context, db idem.Beginner, key, hash string, fn func(pgx.Tx) (charge, error)) (charge, error) {
		tx, err := db.Begin(ctx)
		if err != nil {
			return charge{}, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		out, err := idem.Do(ctx, tx, key, hash, fn)
		var ref *idem.Refusal
		if err == nil || errors.As(err, &ref) {
			// A refusal is an answer, stored in the savepoint: commit it.
			if cerr := tx.Commit(ctx); cerr != nil {
				return out, cerr
			}
		}
		return out, err
	}},
}

// TestContract is the core contract through every node, each on a tenant
// whose shards live on the first worker, so that the coordinator and the
// second worker reach them through Citus: execute, replay, mismatch, a
// refusal stored, a technical failure not stored, and each call a
// single-shard transaction (Citus's own log of what it sent where: one
// node, no PREPARE TRANSACTION).
func TestContract(t *testing.T) {
	c := newCluster(t)
	scope := c.tenantOn(1)
	c.open(scope, 1000)
	ctx := idem.ContextWithScope(context.Background(), scope)
	for _, n := range c.nodes {
		for _, tr := range transports {
			t.Run(n.name+"/"+tr.name, func(t *testing.T) {
				key := "contract-" + n.name + "-" + tr.name
				runs := 0
				n.log.record()
				first, err := tr.do(ctx, n.pool, key, "h1", chargeFn(ctx, scope, key, 10, &runs))
				cmds := n.log.take()
				if err != nil || runs != 1 {
					t.Fatalf("execute: %v, runs %d", err, runs)
				}
				singleShard(t, n, cmds)

				again, err := tr.do(ctx, n.pool, key, "h1", chargeFn(ctx, scope, key, 10, &runs))
				if err != nil || runs != 1 || again != first {
					t.Fatalf("replay: %+v, %v, runs %d; first %+v", again, err, runs, first)
				}
				if _, err := tr.do(ctx, n.pool, key, "h2", chargeFn(ctx, scope, key, 10, &runs)); !errors.Is(err, idem.ErrMismatch) || runs != 1 {
					t.Fatalf("mismatch: %v, runs %d", err, runs)
				}
				if got := c.count("SELECT count(*) FROM charges WHERE scope = $1 AND ref = $2", scope, key); got != 1 {
					t.Fatalf("%d charges, want 1", got)
				}

				// A refusal: fn's writes roll back, the refusal is stored.
				rkey := key + "-refused"
				runs = 0
				_, err = tr.do(ctx, n.pool, rkey, "h1", chargeFn(ctx, scope, rkey, 1<<40, &runs))
				var ref *idem.Refusal
				if !errors.As(err, &ref) || runs != 1 {
					t.Fatalf("refusal: %v, runs %d", err, runs)
				}
				_, err = tr.do(ctx, n.pool, rkey, "h1", chargeFn(ctx, scope, rkey, 1<<40, &runs))
				if !errors.As(err, &ref) || runs != 1 {
					t.Fatalf("refusal replay: %v, runs %d", err, runs)
				}

				// A technical failure: nothing stored, the retry runs.
				fkey := key + "-failed"
				runs = 0
				boom := errors.New("gateway timeout")
				_, err = tr.do(ctx, n.pool, fkey, "h1", func(tx pgx.Tx) (charge, error) {
					_, _ = chargeFn(ctx, scope, fkey, 10, &runs)(tx)
					return charge{}, boom
				})
				if !errors.Is(err, boom) {
					t.Fatalf("failure: %v", err)
				}
				if _, err := tr.do(ctx, n.pool, fkey, "h1", chargeFn(ctx, scope, fkey, 10, &runs)); err != nil || runs != 2 {
					t.Fatalf("retry after a failure: %v, runs %d", err, runs)
				}
				if got := c.count("SELECT count(*) FROM charges WHERE scope = $1 AND ref = $2", scope, fkey); got != 1 {
					t.Fatalf("%d charges after a failure and a retry, want 1", got)
				}
			})
		}
	}
}

// singleShard fails unless the commands Citus logged for one call went to
// one node at most, with no two-phase commit.
func singleShard(t *testing.T, n *node, cmds []remoteCommand) {
	t.Helper()
	servers := map[string]bool{}
	for _, c := range cmds {
		if strings.HasPrefix(c.command, "PREPARE TRANSACTION") || strings.HasPrefix(c.command, "COMMIT PREPARED") {
			for _, c := range cmds {
				t.Logf("%s: %.150s", c.server, c.command)
			}
			t.Fatalf("a two-phase commit through %s: %s on %s", n.name, c.command, c.server)
		}
		if c.server != "local" {
			servers[c.server] = true
		}
	}
	if len(servers) > 1 {
		t.Fatalf("one call through %s reached %d nodes: %v", n.name, len(servers), cmds)
	}
	t.Logf("through %s: %d commands on %v", n.name, len(cmds), servers)
}

// TestInProgressAcrossNodes holds a key through one node and calls it
// through each of the others: ErrInProgress at once, fn not run, and the
// holder's commit then replays everywhere.
func TestInProgressAcrossNodes(t *testing.T) {
	c := newCluster(t)
	scope := c.tenantOn(2)
	c.open(scope, 1000)
	ctx := idem.ContextWithScope(context.Background(), scope)
	for hi, holder := range c.nodes {
		key := fmt.Sprintf("held-%d", hi)
		inFn, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			runs := 0
			_, err := idem.Do(ctx, holder.pool, key, "h", func(tx pgx.Tx) (charge, error) {
				close(inFn)
				<-release
				return chargeFn(ctx, scope, key, 1, &runs)(tx)
			})
			done <- err
		}()
		<-inFn
		for _, other := range c.nodes {
			for _, tr := range transports {
				runs := 0
				_, err := tr.do(ctx, other.pool, key, "h", chargeFn(ctx, scope, key, 1, &runs))
				if !errors.Is(err, idem.ErrInProgress) || runs != 0 {
					t.Fatalf("held through %s, called through %s (%s): %v, runs %d", holder.name, other.name, tr.name, err, runs)
				}
			}
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for _, other := range c.nodes {
			runs := 0
			if _, err := idem.Do(ctx, other.pool, key, "h", chargeFn(ctx, scope, key, 1, &runs)); err != nil || runs != 0 {
				t.Fatalf("replay through %s: %v, runs %d", other.name, err, runs)
			}
		}
	}
	if got := c.count("SELECT count(*) FROM charges WHERE scope = $1", scope); got != len(c.nodes) {
		t.Fatalf("%d charges, want %d", got, len(c.nodes))
	}
}

// TestIsolationLevels: the Citus protocol at every level, through every
// node.
func TestIsolationLevels(t *testing.T) {
	c := newCluster(t)
	scope := c.tenantOn(1)
	c.open(scope, 1000)
	ctx := idem.ContextWithScope(context.Background(), scope)
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		for _, n := range c.nodes {
			key := fmt.Sprintf("iso-%s-%s", iso, n.name)
			runs := 0
			opt := idem.WithTxOptions(pgx.TxOptions{IsoLevel: iso})
			a, err := idem.Do(ctx, n.pool, key, "h", chargeFn(ctx, scope, key, 1, &runs), opt)
			if err != nil || runs != 1 {
				t.Fatalf("%s through %s: %v, runs %d", iso, n.name, err, runs)
			}
			b, err := idem.Do(ctx, n.pool, key, "h", chargeFn(ctx, scope, key, 1, &runs), opt)
			if err != nil || runs != 1 || a != b {
				t.Fatalf("%s replay through %s: %v, runs %d", iso, n.name, err, runs)
			}
		}
	}
	_ = time.Second
}
