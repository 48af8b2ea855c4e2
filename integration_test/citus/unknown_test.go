package citus_test

import (
	"context"
	"errors"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// TestOutcomeUnknown loses the connection to the entry node around COMMIT:
// before the coordinator read it (nothing committed) and after it
// committed (its answer lost). Either way Do does not claim to know, and a
// retry through another node settles the key with one charge.
func TestOutcomeUnknown(t *testing.T) {
	c := newCluster(t)
	scope := c.tenantOn(1)
	c.open(scope, 1000)
	ctx := idem.ContextWithScope(context.Background(), scope)
	for _, tc := range []struct {
		name      string
		match     faultproxy.Match
		committed bool
	}{
		{"commit_lost_on_the_way", faultproxy.ClientSQL("commit"), false},
		{"commit_answer_lost", faultproxy.ServerTag("COMMIT"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(c.nodes[0].url)
			if err != nil {
				t.Fatal(err)
			}
			proxy, err := faultproxy.Start(u.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer proxy.Close()
			u.Host = proxy.Addr()
			cfg, err := pgxpool.ParseConfig(u.String())
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.RuntimeParams["search_path"] = c.schema
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			// Warm the connection (layout, prepared statements) first.
			runs := 0
			if _, err := idem.Do(ctx, pool, tc.name+"-warm", "h", chargeFn(ctx, scope, tc.name+"-warm", 1, &runs)); err != nil {
				t.Fatal(err)
			}
			proxy.SetRule(faultproxy.Once(tc.match, faultproxy.CutBefore))
			key := tc.name
			runs = 0
			_, outcome, err := idem.Run(ctx, pool, key, "h", func(ctx context.Context, tx pgx.Tx) (charge, error) {
				return chargeFn(ctx, scope, key, 1, &runs)(tx)
			})
			if err == nil || runs != 1 {
				t.Fatalf("through a cut connection: outcome %v, %v, runs %d", outcome, err, runs)
			}
			if tc.committed && (!errors.Is(err, idem.ErrOutcomeUnknown) || outcome != idem.OutcomeUnknown) {
				t.Fatalf("COMMIT's answer lost: outcome %v, %v; want ErrOutcomeUnknown", outcome, err)
			}
			// The retry through a worker settles it.
			_, outcome, err = idem.Run(ctx, c.nodes[len(c.nodes)-1].pool, key, "h", func(ctx context.Context, tx pgx.Tx) (charge, error) {
				return chargeFn(ctx, scope, key, 1, &runs)(tx)
			})
			want := idem.OutcomeExecuted
			if tc.committed {
				want = idem.OutcomeReplayed
			}
			if err != nil || outcome != want {
				t.Fatalf("retry: outcome %v, %v; want %v", outcome, err, want)
			}
			if got := c.count("SELECT count(*) FROM charges WHERE scope = $1 AND ref = $2", scope, key); got != 1 {
				t.Fatalf("%d charges, want 1", got)
			}
		})
	}
}
