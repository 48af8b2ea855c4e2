package citus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// TestDuplicatesThroughNodes sends each key's duplicates through every
// node at once: one charge per key, and every caller gets its answer.
func TestDuplicatesThroughNodes(t *testing.T) {
	c := newCluster(t)
	st := storm(t, c, 40, 6, false)
	t.Logf("duplicates: %d keys, %d calls, %d executions, %d replays, %d answers of in progress",
		st.keys, st.calls, st.executed.Load(), st.replayed.Load(), st.inProgress.Load())
}

// TestStormWithTerminations sends duplicates through every node while
// backends are terminated on every node (the callers' sessions and the
// connections Citus opened between nodes): whatever broke, each key
// settles to exactly one charge.
func TestStormWithTerminations(t *testing.T) {
	c := newCluster(t)
	st := storm(t, c, 60, 6, true)
	t.Logf("storm: %d keys, %d calls, %d executions, %d replays, %d in progress, %d failed attempts (%d outcome unknown), %d backends terminated",
		st.keys, st.calls, st.executed.Load(), st.replayed.Load(), st.inProgress.Load(), st.failed.Load(), st.unknown.Load(), st.killed.Load())
	if st.killed.Load() == 0 {
		t.Fatal("no backend was terminated: the storm tested nothing")
	}
}

type stormStats struct {
	keys, calls                                             int
	executed, replayed, inProgress, failed, unknown, killed atomic.Int64
}

// storm runs callers goroutines per key, spread over the nodes and over
// tenants on both workers, each calling until it gets an answer, and checks
// that every key committed one charge and answered the same to all.
func storm(t *testing.T, c *cluster, keys, callers int, kill bool) *stormStats {
	t.Helper()
	scopes := []string{c.tenantOn(1), c.tenantOn(len(c.nodes) - 1)}
	for _, s := range scopes {
		c.open(s, 1<<40)
	}
	st := &stormStats{keys: keys, calls: keys * callers}
	stop := make(chan struct{})
	var killers sync.WaitGroup
	if kill {
		for _, n := range c.nodes {
			killers.Add(1)
			go func() {
				defer killers.Done()
				terminate(t, n, st, stop)
			}()
		}
	}
	answers := make([][]charge, keys)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for k := range keys {
		scope := scopes[k%len(scopes)]
		key := fmt.Sprintf("storm-%d", k)
		ctx := idem.ContextWithScope(context.Background(), scope)
		for i := range callers {
			n := c.nodes[(k+i)%len(c.nodes)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				ch := settle(t, ctx, n, scope, key, st)
				mu.Lock()
				answers[k] = append(answers[k], ch)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	close(stop)
	killers.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for k := range keys {
		scope, key := scopes[k%len(scopes)], fmt.Sprintf("storm-%d", k)
		if got := c.count("SELECT count(*) FROM charges WHERE scope = $1 AND ref = $2", scope, key); got != 1 {
			t.Errorf("key %s: %d charges committed, want 1", key, got)
		}
		for _, a := range answers[k] {
			if a != answers[k][0] {
				t.Errorf("key %s: answers differ: %+v", key, answers[k])
				break
			}
		}
	}
	if got := c.count("SELECT count(*) FROM idempotency_keys WHERE status = 'completed'"); got != keys {
		t.Errorf("%d keys completed, want %d", got, keys)
	}
	return st
}

// settle calls until the key answers: an execution or a replay. Everything
// else (in progress, a terminated session, an outcome unknown) is retried
// with the same key, as a client would.
func settle(t *testing.T, ctx context.Context, n *node, scope, key string, st *stormStats) charge {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		runs := 0
		v, outcome, err := idem.Run(ctx, n.pool, key, "h", func(ctx context.Context, tx pgx.Tx) (charge, error) {
			return chargeFn(ctx, scope, key, 1, &runs)(tx)
		})
		switch {
		case err == nil && outcome == idem.OutcomeExecuted:
			st.executed.Add(1)
			return v
		case err == nil:
			st.replayed.Add(1)
			return v
		case errors.Is(err, idem.ErrInProgress):
			st.inProgress.Add(1)
		case errors.Is(err, idem.ErrMismatch), errors.Is(err, idem.ErrKeyLost):
			t.Errorf("key %s through %s: %v", key, n.name, err)
			return charge{}
		default:
			st.failed.Add(1)
			if errors.Is(err, idem.ErrOutcomeUnknown) {
				st.unknown.Add(1)
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("key %s through %s did not settle: %v", key, n.name, err)
			return charge{}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// terminate ends, every few milliseconds until stop, one backend of
// n's database that serve the test: the callers' sessions and the
// connections Citus opened between nodes.
func terminate(t *testing.T, n *node, st *stormStats, stop <-chan struct{}) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, n.url)
	if err != nil {
		t.Errorf("killer on %s: %v", n.name, err)
		return
	}
	defer conn.Close(ctx)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		var killed int64
		err := conn.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM (SELECT pid FROM pg_stat_activity
			      WHERE pid <> pg_backend_pid() AND datname = current_database()
			        AND (application_name = $1 OR application_name LIKE 'citus_internal gpid=%')
			      ORDER BY random() LIMIT 1) AS victims`, appName).Scan(&killed)
		if err != nil {
			t.Errorf("killer on %s: %v", n.name, err)
			return
		}
		st.killed.Add(killed)
	}
}
