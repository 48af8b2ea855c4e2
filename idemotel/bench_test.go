package idemotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/testkit/testdb"
)

// observers are the variants the benchmarks compare: no observer; idemotel
// on OpenTelemetry's no-op providers (what a service gets before it sets
// up an SDK); idemotel on the SDK, every span sampled and recorded (no
// exporter) and metrics aggregated for a reader.
func observers(b *testing.B) []struct {
	name string
	obs  idem.Observer
} {
	tp := sdktrace.NewTracerProvider()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return []struct {
		name string
		obs  idem.Observer
	}{
		{"none", nil},
		{"idemotel-noop", idemotel.New(idemotel.WithTracerProvider(tracenoop.NewTracerProvider()), idemotel.WithMeterProvider(metricnoop.NewMeterProvider()))},
		{"idemotel-sdk", idemotel.New(idemotel.WithTracerProvider(tp), idemotel.WithMeterProvider(mp))},
	}
}

// BenchmarkHook measures the observer's own work per call, without a
// database: CallStart and CallEnd as idem calls them.
//
//	go test -run '^$' -bench . -benchmem ./   (in idemotel/)
func BenchmarkHook(b *testing.B) {
	for _, o := range observers(b) {
		if o.obs == nil {
			continue
		}
		b.Run(o.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				c := o.obs.CallStart(ctx, idem.CallStart{Table: idem.DefaultTable})
				o.obs.CallEnd(c, idem.CallEnd{Table: idem.DefaultTable, Outcome: idem.OutcomeReplayed, Duration: time.Millisecond})
			}
		})
	}
}

// BenchmarkReplay measures replays through idem.Do, one connection, with
// each observer: the cheapest call, where the hook weighs most.
func BenchmarkReplay(b *testing.B) {
	for _, o := range observers(b) {
		b.Run(o.name, func(b *testing.B) {
			ctx := context.Background()
			keys, err := idem.NewClient(testdb.New(b), &idem.Config{Observer: o.obs})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := idem.Do(ctx, keys, "k", "h", func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
				b.Fatal(err)
			}
			ran := errors.New("fn ran on a replay")
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := idem.Do(ctx, keys, "k", "h", func(pgx.Tx) (int, error) { return 0, ran }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
