package idemotel_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemotel"
)

// An Observer in the Client's Config traces and counts every call. Here a
// ManualReader stands in for a Prometheus exporter or an OTLP pipeline:
// three calls with one key are one execution and two replays.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	// Spans go to the global TracerProvider; WithTracerProvider picks another.
	obs := idemotel.New(idemotel.WithMeterProvider(mp))
	keys, err := idem.NewClient(pool, &idem.Config{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}

	for range 3 {
		_, err := idem.Do(ctx, keys, "order-1042", "request-hash", func(tx pgx.Tx) (int, error) {
			return 42, nil
		})
		if err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != idemotel.MetricCalls {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				outcome, _ := dp.Attributes.Value(idemotel.OutcomeKey)
				lines = append(lines, fmt.Sprintf("%s %s: %d", m.Name, outcome.String(), dp.Value))
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// idem.calls executed: 1
	// idem.calls replayed: 2
}
