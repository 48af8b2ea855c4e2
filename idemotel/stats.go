package idemotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/idemhq/idem/idem"
)

// RegisterStats reports the health of c's key table as observable
// instruments, read with c.Stats when a reader collects (a Prometheus
// scrape, a periodic export):
//
//	idem.key.count{idem.key.state=live|expired|in_progress|unfinished}  keys by state
//	idem.key.in_progress.max_age                              age of the oldest key in progress, s
//	idem.key.unfinished.max_age                               age of the oldest unfinished operation, s
//	idem.table.size                                           table with indexes and TOAST, By
//
// each with idem.table. Live keys are an estimate and are left out until
// PostgreSQL has measured the table (see idem.Stats for which figures are
// exact). One query serves every instrument of a collection; it is bounded
// by WithStatsTimeout, and collections closer together than
// WithStatsInterval share it. A failed query reports nothing for that
// collection and goes to the SDK's error handler.
//
// The figures describe the table, not the process: every instance of a
// service that registers them reports the same values, so aggregate them
// with max, not sum (or register them in one instance).
//
// Options: WithMeterProvider, WithStatsTimeout, WithStatsInterval; others
// have no effect. Call Unregister on the returned Registration to stop.
func RegisterStats(c *idem.Client, opts ...Option) (metric.Registration, error) {
	if c == nil {
		return nil, errors.New("idemotel: RegisterStats needs a client")
	}
	cfg := newConfig(opts)
	meter := cfg.mp.Meter(instrumentationName, metric.WithSchemaURL(semconv.SchemaURL))
	keys, err := meter.Int64ObservableUpDownCounter(MetricKeyCount,
		metric.WithUnit("{key}"),
		metric.WithDescription("Keys in the idem key table, by state: live (estimated), expired and awaiting the sweeper, in progress, unfinished operations."))
	if err != nil {
		return nil, err
	}
	age, err := meter.Float64ObservableGauge(MetricInProgressMaxAge,
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest key in progress (of its transaction); 0 when none."))
	if err != nil {
		return nil, err
	}
	unfinishedAge, err := meter.Float64ObservableGauge(MetricUnfinishedMaxAge,
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unfinished operation (idem.Operation), from its beginning; 0 when none."))
	if err != nil {
		return nil, err
	}
	size, err := meter.Int64ObservableUpDownCounter(MetricTableSize,
		metric.WithUnit("By"),
		metric.WithDescription("Size of the idem key table on disk, with its indexes and TOAST data."))
	if err != nil {
		return nil, err
	}
	p := &statsPoller{client: c, timeout: cfg.statsTimeout, interval: cfg.statsInterval}
	table := TableKey.String(c.Table())
	live := metric.WithAttributeSet(attribute.NewSet(table, KeyStateKey.String("live")))
	expired := metric.WithAttributeSet(attribute.NewSet(table, KeyStateKey.String("expired")))
	inProgress := metric.WithAttributeSet(attribute.NewSet(table, KeyStateKey.String("in_progress")))
	unfinished := metric.WithAttributeSet(attribute.NewSet(table, KeyStateKey.String("unfinished")))
	tableOnly := metric.WithAttributeSet(attribute.NewSet(table))
	return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, err := p.stats(ctx)
		if err != nil {
			return err
		}
		if st.Live >= 0 {
			o.ObserveInt64(keys, st.Live, live)
		}
		o.ObserveInt64(keys, st.Expired, expired)
		o.ObserveInt64(keys, st.InProgress, inProgress)
		o.ObserveFloat64(age, st.OldestInProgress.Seconds(), tableOnly)
		o.ObserveInt64(keys, st.Unfinished, unfinished)
		o.ObserveFloat64(unfinishedAge, st.OldestUnfinished.Seconds(), tableOnly)
		o.ObserveInt64(size, st.TableBytes, tableOnly)
		return nil
	}, keys, age, unfinishedAge, size)
}

// statsPoller reads Stats for collections, at most once per interval.
type statsPoller struct {
	client   *idem.Client
	timeout  time.Duration
	interval time.Duration

	mu   sync.Mutex // held during a query: concurrent collections share it
	at   time.Time
	last idem.Stats
	err  error
}

func (p *statsPoller) stats(ctx context.Context) (idem.Stats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.at.IsZero() && time.Since(p.at) < p.interval {
		return p.last, p.err
	}
	if p.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	p.last, p.err = p.client.Stats(ctx)
	p.at = time.Now()
	return p.last, p.err
}

func handle(err error) {
	if err != nil {
		otel.Handle(err)
	}
}
