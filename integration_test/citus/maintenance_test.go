package citus_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemhq/idem/idem"
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
