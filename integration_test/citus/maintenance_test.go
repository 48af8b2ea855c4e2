package citus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/schema"
)

// TestLookupForgetSweep: Lookup and Forget through every node, and Sweep
// deleting expired keys on every shard.
func TestLookupForgetSweep(t *testing.T) {
	c := newCluster(t)
	scope := c.tenantOn(1)
	c.open(scope, 1000)
	ctx := idem.ContextWithScope(context.Background(), scope)
	for _, n := range c.nodes {
		cl, err := idem.NewClient(n.pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		key := "kept-" + n.name
		runs := 0
		if _, err := idem.Do(ctx, cl, key, "h", chargeFn(ctx, scope, key, 1, &runs)); err != nil {
			t.Fatal(err)
		}
		rec, err := cl.Lookup(ctx, scope, key)
		if err != nil || rec.Status != "completed" {
			t.Fatalf("lookup through %s: %+v, %v", n.name, rec, err)
		}
		forgotten, err := cl.Forget(ctx, scope, key)
		if err != nil || !forgotten {
			t.Fatalf("forget through %s: %v, %v", n.name, forgotten, err)
		}
		if _, err := idem.Do(ctx, cl, key, "h", chargeFn(ctx, scope, key, 1, &runs)); err != nil || runs != 2 {
			t.Fatalf("after forget through %s: %v, runs %d", n.name, err, runs)
		}
	}
	other := c.tenantOn(len(c.nodes) - 1)
	c.open(other, 1000)
	octx := idem.ContextWithScope(context.Background(), other)
	for _, k := range []string{"old-1", "old-2"} {
		runs := 0
		if _, err := idem.Do(octx, c.nodes[0].pool, k, "h", chargeFn(octx, other, k, 1, &runs)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.nodes[0].pool.Exec(context.Background(),
		"UPDATE idempotency_keys SET created_at = $2, expires_at = $2, completed_at = $2 WHERE idempotency_key IN ('old-1', 'kept-'||$1)", c.nodes[0].name, time.Now().Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	cl, err := idem.NewClient(c.nodes[1].pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := cl.Sweep(context.Background())
	if err != nil || n != 2 {
		t.Fatalf("sweep: %d, %v; want 2 expired keys deleted", n, err)
	}
	if got := c.count("SELECT count(*) FROM idempotency_keys"); got != len(c.nodes) {
		t.Fatalf("%d keys left, want %d", got, len(c.nodes))
	}
}

// TestCheck: Client.Check through the coordinator and a worker passes on
// the layout schema.ApplyDistributed made, and names a key table that is
// not distributed, not colocated with Config.ColocateWith, or whose
// operations' tables are colocated elsewhere.
func TestCheck(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	coord := c.nodes[0].pool
	exec := func(sql string) {
		t.Helper()
		if _, err := coord.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE loose (scope text PRIMARY KEY);
	      SELECT create_distributed_table('loose', 'scope', colocate_with => 'none')`)
	if err := schema.ApplyTable(ctx, coord, "local_keys"); err != nil {
		t.Fatal(err)
	}
	if err := schema.ApplyTable(ctx, coord, "split_keys"); err != nil {
		t.Fatal(err)
	}
	exec(`SELECT create_distributed_table('split_keys', 'scope', colocate_with => 'accounts');
	      SELECT create_distributed_table('split_keys_operations', 'scope', colocate_with => 'loose');
	      SELECT create_distributed_table('split_keys_steps', 'scope', colocate_with => 'accounts')`)
	for _, n := range []*node{c.nodes[0], c.nodes[len(c.nodes)-1]} {
		check := func(cfg idem.Config) error {
			cl, err := idem.NewClient(n.pool, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			return cl.Check(ctx)
		}
		notDistributed := []string{"local_keys is not distributed", "schema.ApplyDistributed"}
		if n != c.nodes[0] { // a table local to the coordinator is not on a worker
			notDistributed = []string{"local_keys does not exist"}
		}
		for _, tc := range []struct {
			name string
			cfg  idem.Config
			want []string // nil: Check passes
		}{
			{"distributed", idem.Config{}, nil},
			{"colocated", idem.Config{ColocateWith: "accounts"}, nil},
			{"not colocated", idem.Config{ColocateWith: "loose"}, []string{"not colocated with loose", "update_distributed_table_colocation"}},
			{"colocated with a missing table", idem.Config{ColocateWith: "nowhere"}, []string{"nowhere, which does not exist"}},
			{"not distributed", idem.Config{Table: "local_keys"}, notDistributed},
			{"operations elsewhere", idem.Config{Table: "split_keys", ColocateWith: "accounts"}, []string{"(split_keys_operations)"}},
		} {
			t.Run(n.name+"/"+tc.name, func(t *testing.T) {
				err := check(tc.cfg)
				if tc.want == nil {
					if err != nil {
						t.Fatal(err)
					}
					return
				}
				if err == nil {
					t.Fatalf("Check passed; want it to say %q", tc.want)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("Check: %v\nwant it to say %q", err, w)
					}
				}
			})
		}
	}
}

// TestStats reads the keys where they are, through the coordinator and a
// worker: the row estimate and the size of the shards (not the empty shell
// on the entry node), the expired keys of every shard, a key in progress
// on a worker, and an unfinished operation.
func TestStats(t *testing.T) {
	c := newCluster(t)
	scopes := []string{c.tenantOn(1), c.tenantOn(len(c.nodes) - 1)}
	const perScope = 20
	for _, scope := range scopes {
		c.open(scope, 1000)
		ctx := idem.ContextWithScope(context.Background(), scope)
		for i := range perScope {
			key := fmt.Sprintf("stats-%d", i)
			runs := 0
			if _, err := idem.Do(ctx, c.nodes[0].pool, key, "h", chargeFn(ctx, scope, key, 1, &runs)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := c.nodes[0].pool.Exec(context.Background(),
		"UPDATE idempotency_keys SET created_at = $1, completed_at = $1, expires_at = $1 WHERE idempotency_key IN ('stats-0', 'stats-1')",
		time.Now().Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}

	// A key in progress on the second worker, and an unfinished operation
	// on the first.
	holdCtx := idem.ContextWithScope(context.Background(), scopes[1])
	inFn, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := idem.Do(holdCtx, c.nodes[0].pool, "held", "h", func(tx pgx.Tx) (charge, error) {
			close(inFn)
			<-release
			return charge{}, nil
		})
		held <- err
	}()
	<-inFn
	defer func() {
		close(release)
		if err := <-held; err != nil {
			t.Error(err)
		}
	}()
	for _, sql := range []string{
		`INSERT INTO idempotency_keys (scope, idempotency_key, request_hash, status, expires_at)
		 VALUES ($1, 'unfinished', 'h', 'unfinished', now() + interval '1 day')`,
		`INSERT INTO idempotency_keys_operations (scope, idempotency_key, operation, request, run, lease_until)
		 VALUES ($1, 'unfinished', 'pay', '{}', gen_random_uuid(), now())`,
	} {
		if _, err := c.nodes[0].pool.Exec(context.Background(), sql, scopes[0]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.nodes[0].pool.Exec(context.Background(), "ANALYZE idempotency_keys"); err != nil {
		t.Fatal(err)
	}

	for _, n := range []*node{c.nodes[0], c.nodes[len(c.nodes)-1]} {
		cl, err := idem.NewClient(n.pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := cl.Stats(context.Background())
		if err != nil {
			t.Fatalf("stats through %s: %v", n.name, err)
		}
		t.Logf("through %s: %+v", n.name, st)
		switch {
		case st.Rows != 2*perScope+1:
			t.Fatalf("through %s: Rows %d, want %d (the shards' estimate after ANALYZE)", n.name, st.Rows, 2*perScope+1)
		case st.Expired != 4:
			t.Fatalf("through %s: Expired %d, want 4", n.name, st.Expired)
		case st.InProgress != 1 || st.OldestInProgress <= 0:
			t.Fatalf("through %s: InProgress %d, OldestInProgress %v; want the key held", n.name, st.InProgress, st.OldestInProgress)
		case st.Unfinished != 1 || st.OldestUnfinished <= 0:
			t.Fatalf("through %s: Unfinished %d, OldestUnfinished %v; want 1", n.name, st.Unfinished, st.OldestUnfinished)
		case st.TableBytes <= 8192*3:
			t.Fatalf("through %s: TableBytes %d: the shell's size, not the shards'", n.name, st.TableBytes)
		}
	}
}

// TestLookupAndForgetInProgress holds a key through each node and asks
// Lookup and Forget about it through every node: Lookup reports it in
// progress, and Forget answers ErrInProgress without touching it, both
// deciding on the shard's node, where the claim's lock is. After the
// holder commits, Lookup finds the answer and Forget deletes it.
func TestLookupAndForgetInProgress(t *testing.T) {
	c := newCluster(t)
	scope := c.tenantOn(1)
	c.open(scope, 1000)
	ctx := idem.ContextWithScope(context.Background(), scope)
	for hi, holder := range c.nodes {
		key := fmt.Sprintf("busy-%d", hi)
		inFn, release := make(chan struct{}), make(chan struct{})
		var releaseOnce sync.Once
		// A failure below must still end the holder's transaction, or
		// closing its pool would wait for it forever.
		t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
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
			cl, err := idem.NewClient(other.pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			rec, err := cl.Lookup(ctx, scope, key)
			if err != nil || rec.Status != idem.StatusInProgress {
				t.Fatalf("held through %s, looked up through %s: %+v, %v; want in progress", holder.name, other.name, rec, err)
			}
			if forgotten, err := cl.Forget(ctx, scope, key); !errors.Is(err, idem.ErrInProgress) || forgotten {
				t.Fatalf("held through %s, forgotten through %s: %v, %v; want ErrInProgress", holder.name, other.name, forgotten, err)
			}
		}
		releaseOnce.Do(func() { close(release) })
		if err := <-done; err != nil {
			t.Fatalf("the holder through %s: %v", holder.name, err)
		}
		cl, err := idem.NewClient(c.nodes[(hi+1)%len(c.nodes)].pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rec, err := cl.Lookup(ctx, scope, key); err != nil || rec.Status != idem.StatusCompleted {
			t.Fatalf("after the commit: %+v, %v", rec, err)
		}
		if forgotten, err := cl.Forget(ctx, scope, key); err != nil || !forgotten {
			t.Fatalf("forget after the commit: %v, %v", forgotten, err)
		}
	}
	if got := c.count("SELECT count(*) FROM charges WHERE scope = $1", scope); got != len(c.nodes) {
		t.Fatalf("%d charges, want %d", got, len(c.nodes))
	}
}
