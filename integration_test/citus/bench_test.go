package citus_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// BenchmarkDoVersusBare prices idem.Do on Citus against the same work in a
// bare transaction, side by side, through the coordinator, through the
// worker that does not hold the tenant's shard and through the one that
// does: one client (latency) and eight (throughput), and the round trips
// each call takes (rt/op: the times a client sent after it had read). The
// work charges one tenant's account and records the charge; each Do is a
// first execution under a new key.
//
//	IDEM_TEST_CITUS_URL=postgres://... go test -run '^$' -bench . -count 3 ./integration_test/citus
func BenchmarkDoVersusBare(b *testing.B) {
	c := newCluster(b)
	scope := c.tenantOn(1)
	c.open(scope, 1<<60)
	entries := []struct {
		name string
		n    *node
	}{{"coordinator", c.nodes[0]}, {"worker_without_shard", c.nodes[len(c.nodes)-1]}, {"worker_with_shard", c.nodes[1]}}
	for _, e := range entries {
		pool, trips := countingPool(b, e.n.url, c.schema)
		for _, clients := range []int{1, 8} {
			for _, v := range []string{"bare", "do"} {
				b.Run(fmt.Sprintf("%s/clients=%d/%s", e.name, clients, v), func(b *testing.B) {
					var seq atomic.Int64
					ctx := idem.ContextWithScope(context.Background(), scope)
					one := func() {
						i := seq.Add(1)
						ref := fmt.Sprintf("%s-%d-%s-%d-%d", e.name, clients, v, b.N, i)
						work := func(tx pgx.Tx) (charge, error) {
							runs := 0
							return chargeFn(ctx, scope, ref, 1, &runs)(tx)
						}
						var err error
						if v == "bare" {
							err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := work(tx); return err })
						} else {
							_, err = idem.Do(ctx, pool, ref, "h", work)
						}
						if err != nil {
							b.Error(err)
						}
					}
					for range 8 { // warm the pool's connections
						one()
					}
					before := trips.Load()
					b.ResetTimer()
					if clients == 1 {
						for range b.N {
							one()
						}
					} else {
						b.SetParallelism(clients)
						b.RunParallel(func(pb *testing.PB) {
							for pb.Next() {
								one()
							}
						})
					}
					b.StopTimer()
					b.ReportMetric(float64(trips.Load()-before)/float64(b.N), "rt/op")
				})
			}
		}
		pool.Close()
	}
}

// countingPool is a pool on url whose connections count their round trips.
func countingPool(b *testing.B, url, schema string) (*pgxpool.Pool, *atomic.Int64) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	trips := &atomic.Int64{}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &tripConn{Conn: conn, trips: trips}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	return pool, trips
}

// tripConn counts a round trip each time the client writes after reading.
type tripConn struct {
	net.Conn
	trips   *atomic.Int64
	readNow bool
}

func (c *tripConn) Write(p []byte) (int, error) {
	if c.readNow {
		c.readNow = false
		c.trips.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *tripConn) Read(p []byte) (int, error) {
	c.readNow = true
	return c.Conn.Read(p)
}
