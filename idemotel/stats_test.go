package idemotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/testkit/holdkeys"
	"github.com/idemhq/idem/testkit/testdb"
)

// stats is what RegisterStats reported at one collection.
type stats struct {
	keys   map[string]int64 // by idem.key.state
	maxAge float64
	// unfinishedAge is the age of the oldest unfinished operation.
	unfinishedAge float64
	size          int64
	tables        map[string]bool
}

func (tm *telemetry) stats(t *testing.T) (stats, error) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	err := tm.reader.Collect(context.Background(), &rm)
	st := stats{keys: map[string]int64{}, maxAge: -1, unfinishedAge: -1, size: -1, tables: map[string]bool{}}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case idemotel.MetricKeyCount:
				sum := m.Data.(metricdata.Sum[int64])
				if sum.IsMonotonic || m.Unit != "{key}" {
					t.Fatalf("%s: monotonic or unit %q", m.Name, m.Unit)
				}
				for _, dp := range sum.DataPoints {
					state, _ := dp.Attributes.Value(idemotel.KeyStateKey)
					table, _ := dp.Attributes.Value(idemotel.TableKey)
					st.keys[state.AsString()] = dp.Value
					st.tables[table.AsString()] = true
				}
			case idemotel.MetricInProgressMaxAge:
				if m.Unit != "s" {
					t.Fatalf("%s: unit %q", m.Name, m.Unit)
				}
				for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
					st.maxAge = dp.Value
				}
			case idemotel.MetricUnfinishedMaxAge:
				for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
					st.unfinishedAge = dp.Value
				}
			case idemotel.MetricTableSize:
				if m.Unit != "By" {
					t.Fatalf("%s: unit %q", m.Name, m.Unit)
				}
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					st.size = dp.Value
				}
			}
		}
	}
	return st, err
}

// TestRegisterStats checks the key-table gauges against a database with
// known keys: live, expired and held in progress.
func TestRegisterStats(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	const live, expired, inProgress = 7, 4, 3
	for i := range live + expired {
		if _, err := idem.Do(ctx, keys, fmt.Sprintf("done-%d", i), "h", func(pgx.Tx) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `
		UPDATE idempotency_keys SET created_at = created_at - interval '2 days',
		       completed_at = completed_at - interval '2 days', expires_at = expires_at - interval '2 days'
		WHERE idempotency_key IN ('done-0', 'done-1', 'done-2', 'done-3')`); err != nil {
		t.Fatal(err)
	}

	// An unfinished operation, begun an hour ago, as idem.Operation's first
	// step leaves it.
	if _, err := pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scope, idempotency_key, request_hash, status, created_at, expires_at)
		VALUES ('', 'op-1', 'h', 'unfinished', now() - interval '1 hour', now() + interval '23 hours');
		INSERT INTO idempotency_keys_operations (scope, idempotency_key, operation, request, run, lease_until, created_at)
		VALUES ('', 'op-1', 'charge', '{}', gen_random_uuid(), now(), now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}

	tm := newTelemetry(t)
	reg, err := idemotel.RegisterStats(keys, idemotel.WithMeterProvider(tm.mp), idemotel.WithStatsInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()

	// Before PostgreSQL has measured the table, live keys are unknown and
	// left out; the exact figures are there.
	st, err := tm.stats(t)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.keys["live"]; ok || st.keys["expired"] != expired || st.keys["in_progress"] != 0 || st.size <= 0 || st.maxAge != 0 {
		t.Fatalf("before ANALYZE: %+v; want no live figure, %d expired, none in progress", st, expired)
	}

	if _, err := pool.Exec(ctx, "ANALYZE idempotency_keys"); err != nil {
		t.Fatal(err)
	}
	holdkeys.Hold(t, keys, "held", inProgress)
	heldSince := time.Now()
	time.Sleep(50 * time.Millisecond)
	heldFor := time.Since(heldSince)
	st, err = tm.stats(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", st)
	if st.keys["live"] != live || st.keys["expired"] != expired || st.keys["in_progress"] != inProgress {
		t.Fatalf("key counts %v; want %d live, %d expired, %d in progress", st.keys, live, expired, inProgress)
	}
	if st.keys["unfinished"] != 1 || st.unfinishedAge < 3600 {
		t.Fatalf("unfinished operations %d, the oldest %.0fs old; want 1, an hour old", st.keys["unfinished"], st.unfinishedAge)
	}
	if st.maxAge < heldFor.Seconds() {
		t.Fatalf("oldest key in progress %.3fs old; held for at least %.3fs", st.maxAge, heldFor.Seconds())
	}
	if len(st.tables) != 1 || !st.tables[idem.DefaultTable] {
		t.Fatalf("tables %v", st.tables)
	}
}

// TestRegisterStatsInterval checks that collections within the interval
// share one query, and that a failing query reports nothing.
func TestRegisterStatsInterval(t *testing.T) {
	pool := testdb.New(t)
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	tm := newTelemetry(t)
	reg, err := idemotel.RegisterStats(keys, idemotel.WithMeterProvider(tm.mp), idemotel.WithStatsInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	if st, err := tm.stats(t); err != nil || st.keys["in_progress"] != 0 {
		t.Fatalf("%+v %v", st, err)
	}
	holdkeys.Hold(t, keys, "held", 1)
	if st, err := tm.stats(t); err != nil || st.keys["in_progress"] != 0 {
		t.Fatalf("within the interval: %+v %v; want the first collection's figures", st, err)
	}

	down, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	unreachable, err := idem.NewClient(down, nil)
	if err != nil {
		t.Fatal(err)
	}
	tm2 := newTelemetry(t)
	reg2, err := idemotel.RegisterStats(unreachable, idemotel.WithMeterProvider(tm2.mp), idemotel.WithStatsTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg2.Unregister() }()
	st, err := tm2.stats(t)
	if err == nil || len(st.keys) != 0 || st.size != -1 {
		t.Fatalf("database down: %+v, %v; want an error and no figures", st, err)
	}
}
