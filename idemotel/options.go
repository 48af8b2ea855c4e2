package idemotel

import (
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures New or RegisterStats. Each option states where it
// applies; elsewhere it has no effect.
type Option func(*config)

type config struct {
	tp            trace.TracerProvider
	mp            metric.MeterProvider
	scopeOnSpans  bool
	errorMessages bool
	statsTimeout  time.Duration
	statsInterval time.Duration
}

// Defaults of RegisterStats.
const (
	// DefaultStatsTimeout bounds one Stats query made for a collection.
	DefaultStatsTimeout = 5 * time.Second
	// DefaultStatsInterval is the least time between two Stats queries:
	// collections within it (several readers, a scrape storm) share one.
	DefaultStatsInterval = time.Second
)

func newConfig(opts []Option) config {
	c := config{statsTimeout: DefaultStatsTimeout, statsInterval: DefaultStatsInterval}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	return c
}

// WithTracerProvider sets the TracerProvider the spans come from. Defaults
// to the global one (otel.GetTracerProvider) at the time of New. Applies to
// New.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the MeterProvider the instruments come from.
// Defaults to the global one (otel.GetMeterProvider) at the time of New or
// RegisterStats. Applies to New and RegisterStats.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithScopeOnSpans puts each call's scope on its span as idem.scope.
// Scopes are tenant or user ids: personal data in many deployments, and of
// unbounded cardinality, so they are off by default and never on metrics.
// Applies to New.
func WithScopeOnSpans(on bool) Option {
	return func(c *config) { c.scopeOnSpans = on }
}

// WithErrorMessages records the text of a failed call's error on its span
// (the status description and the exception event's exception.message).
// By default only the error's type is recorded (error.type): an error that
// fn returns may quote client data, the idempotency key included, and the
// key lets its holder read the stored answer. With it on, client input
// may then reach traces, and everyone who can read them: a request body's
// values, a header or the key, quoted in an error by fn, a driver or a
// parser. Turn it on only where traces are as protected as the data
// itself. Applies to New.
func WithErrorMessages(on bool) Option {
	return func(c *config) { c.errorMessages = on }
}

// WithStatsTimeout bounds each Stats query made for a collection. Defaults
// to DefaultStatsTimeout. Applies to RegisterStats.
func WithStatsTimeout(d time.Duration) Option {
	return func(c *config) { c.statsTimeout = d }
}

// WithStatsInterval sets the least time between two Stats queries;
// collections within it report the figures of the last query. 0 queries
// at every collection. Defaults to DefaultStatsInterval. Applies to
// RegisterStats.
func WithStatsInterval(d time.Duration) Option {
	return func(c *config) { c.statsInterval = d }
}
