package integration_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// TestFaultForgetAnswerLost loses Forget's answer after the server ran it:
// the delete commits on its own at the statement's Sync, so without the
// ReadyForQuery that follows, Forget cannot know whether it committed and
// must say so (ErrOutcomeUnknown), never "failed". Here it did commit.
func TestFaultForgetAnswerLost(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	pool := l.pool(func(c *pgxpool.Config) { c.MaxConns = 1 })
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, keys, "k-forget", ledgerHash, chargeWork(ctx, "k-forget", 1, 5, nil)); err != nil {
		t.Fatal(err)
	}
	// Warms the connection: Forget's statement is prepared, so its trip is
	// then Bind, Execute, Sync, answered up to one ReadyForQuery.
	if _, err := keys.Forget(ctx, "", "k-other"); err != nil {
		t.Fatal(err)
	}
	l.proxy.SetRule(faultproxy.Once(faultproxy.ServerType('Z'), faultproxy.CutBefore))
	_, err = keys.Forget(ctx, "", "k-forget")
	l.proxy.SetRule(nil)
	if !errors.Is(err, idem.ErrOutcomeUnknown) {
		t.Fatalf("Forget with its answer lost: %v; want ErrOutcomeUnknown", err)
	}
	admin, err := idem.NewClient(l.admin, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Lookup(ctx, "", "k-forget"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Lookup after the lost answer: %v; the server committed the delete", err)
	}
}
