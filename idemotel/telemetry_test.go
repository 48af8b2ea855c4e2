package idemotel_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/testkit/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// telemetry is an in-memory OpenTelemetry pipeline: every span ended and
// every metric, read on demand.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry(t testing.TB) *telemetry {
	t.Helper()
	tm := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tm.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tm.spans))
	tm.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tm.reader))
	t.Cleanup(func() {
		_ = tm.tp.Shutdown(context.Background())
		_ = tm.mp.Shutdown(context.Background())
	})
	return tm
}

// observer returns an idemotel Observer on this pipeline.
func (tm *telemetry) observer(opts ...idemotel.Option) *idemotel.Observer {
	return idemotel.New(append([]idemotel.Option{idemotel.WithTracerProvider(tm.tp), idemotel.WithMeterProvider(tm.mp)}, opts...)...)
}

func (tm *telemetry) collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tm.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// counts is a snapshot of idem.calls and of the number of idem.duration
// records, by attribute set ("k=v,k=v").
type counts struct {
	calls     map[string]int64
	durations map[string]uint64
}

func (tm *telemetry) counts(t testing.TB) counts {
	t.Helper()
	c := counts{calls: map[string]int64{}, durations: map[string]uint64{}}
	for _, sm := range tm.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case idemotel.MetricCalls:
				sum, ok := m.Data.(metricdata.Sum[int64])
				if !ok || !sum.IsMonotonic || m.Unit != "{call}" {
					t.Fatalf("%s: %T monotonic=%v unit %q; want a monotonic int64 sum in {call}", m.Name, m.Data, sum.IsMonotonic, m.Unit)
				}
				for _, dp := range sum.DataPoints {
					c.calls[encode(dp.Attributes)] = dp.Value
				}
			case idemotel.MetricDuration:
				h, ok := m.Data.(metricdata.Histogram[float64])
				if !ok || m.Unit != "s" {
					t.Fatalf("%s: %T unit %q; want a float64 histogram in s", m.Name, m.Data, m.Unit)
				}
				for _, dp := range h.DataPoints {
					c.durations[encode(dp.Attributes)] = dp.Count
				}
			}
		}
	}
	return c
}

// since returns the attribute sets whose counts grew since before, and by
// how much.
func (c counts) since(before counts) (calls map[string]int64, durations map[string]uint64) {
	calls, durations = map[string]int64{}, map[string]uint64{}
	for k, v := range c.calls {
		if d := v - before.calls[k]; d != 0 {
			calls[k] = d
		}
	}
	for k, v := range c.durations {
		if d := v - before.durations[k]; d != 0 {
			durations[k] = d
		}
	}
	return calls, durations
}

func encode(s attribute.Set) string { return s.Encoded(attribute.DefaultEncoder()) }

// attrs renders key-value pairs as an encoded set, for comparisons.
func attrs(kv ...attribute.KeyValue) string { return encode(attribute.NewSet(kv...)) }

// ended returns the spans ended so far.
func (tm *telemetry) ended() []sdktrace.ReadOnlySpan { return tm.spans.Ended() }

// dump renders everything the pipeline captured as text: span names,
// attributes, events, status descriptions and links, and every metric's
// name, description and data points' attributes. Tests search it for what
// must never be exported.
func (tm *telemetry) dump(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	kvs := func(kv []attribute.KeyValue) {
		for _, a := range kv {
			fmt.Fprintf(&b, " %s=%s", a.Key, a.Value.String())
		}
	}
	for _, s := range tm.ended() {
		fmt.Fprintf(&b, "span %s status=%v %q", s.Name(), s.Status().Code, s.Status().Description)
		kvs(s.Attributes())
		for _, e := range s.Events() {
			fmt.Fprintf(&b, " event %s", e.Name)
			kvs(e.Attributes)
		}
		for _, l := range s.Links() {
			kvs(l.Attributes)
		}
		kvs(s.Resource().Attributes())
		b.WriteString("\n")
	}
	rm := tm.collect(t)
	kvs(rm.Resource.Attributes())
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			fmt.Fprintf(&b, "metric %s %q %s:", m.Name, m.Description, m.Unit)
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					kvs(dp.Attributes.ToSlice())
					for _, e := range dp.Exemplars {
						kvs(e.FilteredAttributes)
					}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					kvs(dp.Attributes.ToSlice())
					for _, e := range dp.Exemplars {
						kvs(e.FilteredAttributes)
					}
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					kvs(dp.Attributes.ToSlice())
				}
			default:
				t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
