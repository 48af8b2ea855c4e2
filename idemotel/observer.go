package idemotel

import (
	"context"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/idem"
)

// instrumentationName names idemotel's tracer and meter.
const instrumentationName = "github.com/idemhq/idem/idemotel"

// durationBuckets are the histogram's bucket bounds in seconds: those of
// OpenTelemetry's HTTP duration metrics, with three below 5 ms, where
// replays fall.
var durationBuckets = []float64{
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
	0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
}

// internalKind is the calls' span kind: work inside the service.
var internalKind = trace.WithSpanKind(trace.SpanKindInternal)

// maxCachedSets bounds the cache of metric attribute sets. The sets are
// few (outcomes times tables, operations, statuses and error types); past
// the bound they are built per call.
const maxCachedSets = 4096

// Observer is an idem.Observer that records every call as a span and in
// the metrics idem.calls and idem.duration, and, as an idem.StepObserver,
// every step of an idem.Operation as a span and in idem.step.duration (see
// the package documentation for every name). It is safe for concurrent
// use. Pass it in idem.Config.Observer, idemhttp.Config.Observer or
// idem.WithObserver.
type Observer struct {
	tracer        trace.Tracer
	calls         metric.Int64Counter
	duration      metric.Float64Histogram
	stepDuration  metric.Float64Histogram
	scopeOnSpans  bool
	errorMessages bool

	mu       sync.RWMutex
	sets     map[setKey]metric.MeasurementOption
	stepSets map[stepSetKey]metric.MeasurementOption
}

// New returns an Observer on the given providers (the global ones unless
// WithTracerProvider and WithMeterProvider say otherwise).
//
//	obs := idemotel.New(idemotel.WithTracerProvider(tp), idemotel.WithMeterProvider(mp))
//	keys, err := idem.NewClient(pool, &idem.Config{Observer: obs})
//
// Should an instrument fail to be created (a MeterProvider refusing the
// names, say), the error goes to otel.Handle and the Observer records
// nothing in that instrument; spans are unaffected.
func New(opts ...Option) *Observer {
	c := newConfig(opts)
	meter := c.mp.Meter(instrumentationName, metric.WithSchemaURL(semconv.SchemaURL))
	o := &Observer{
		tracer:        c.tp.Tracer(instrumentationName, trace.WithSchemaURL(semconv.SchemaURL)),
		scopeOnSpans:  c.scopeOnSpans,
		errorMessages: c.errorMessages,
		sets:          map[setKey]metric.MeasurementOption{},
		stepSets:      map[stepSetKey]metric.MeasurementOption{},
	}
	var err error
	o.calls, err = meter.Int64Counter(MetricCalls,
		metric.WithUnit("{call}"),
		metric.WithDescription("Calls of idem.Do, Run, Wrap and requests under idemhttp, by outcome."))
	handle(err)
	o.duration, err = meter.Float64Histogram(MetricDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Duration of calls of idem.Do, Run, Wrap and requests under idemhttp, validation to return."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	handle(err)
	o.stepDuration, err = meter.Float64Histogram(MetricStepDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Duration of the steps of idem.Operation calls; 0 for a step recorded earlier, which did not run."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	handle(err)
	return o
}

// CallStart starts the call's span, a child of the span in ctx, and
// returns ctx with it. It implements idem.Observer.
func (o *Observer) CallStart(ctx context.Context, c idem.CallStart) context.Context {
	operation, scope := splitScope(c.Scope)
	var buf [4]attribute.KeyValue
	attrs := append(buf[:0], TableKey.String(c.Table))
	if operation != "" {
		attrs = append(attrs, OperationKey.String(operation))
	}
	if c.Resume {
		attrs = append(attrs, ResumeKey.Bool(true))
	}
	if o.scopeOnSpans {
		attrs = append(attrs, ScopeKey.String(scope))
	}
	ctx, _ = o.tracer.Start(ctx, SpanName, internalKind, trace.WithAttributes(attrs...))
	return ctx
}

// CallEnd counts the call, records its duration and ends its span. It
// implements idem.Observer.
func (o *Observer) CallEnd(ctx context.Context, c idem.CallEnd) {
	operation, _ := splitScope(c.Scope)
	var errType string
	if failure(c.Outcome) {
		errType = errorType(&c)
	}
	set := o.set(setKey{c.Outcome, c.Refused, c.Table, operation, errType, c.HTTPStatus, c.Resume})
	if o.calls != nil {
		o.calls.Add(ctx, 1, set)
	}
	if o.duration != nil {
		o.duration.Record(ctx, c.Duration.Seconds(), set)
	}

	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		var buf [5]attribute.KeyValue
		attrs := append(buf[:0], OutcomeKey.String(c.Outcome.String()), RefusedKey.Bool(c.Refused), WaitedKey.Bool(c.Waited))
		if c.HTTPStatus != 0 {
			attrs = append(attrs, semconv.HTTPResponseStatusCode(c.HTTPStatus))
		}
		if errType != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(errType))
		}
		span.SetAttributes(attrs...)
		if isError(&c) {
			o.recordError(span, &c, errType)
		}
	}
	span.End()
}

// recordError marks the span as failed with an exception event that names
// the error's type, and its text only under WithErrorMessages.
func (o *Observer) recordError(span trace.Span, c *idem.CallEnd, errType string) {
	o.recordErr(span, c.Err, errType)
}

// recordErr is recordError for an error err, which may be nil.
func (o *Observer) recordErr(span trace.Span, err error, errType string) {
	desc := errType
	event := []attribute.KeyValue{semconv.ExceptionTypeKey.String(errType)}
	if o.errorMessages && err != nil {
		desc = err.Error()
		event = append(event, semconv.ExceptionMessageKey.String(desc))
	}
	span.AddEvent("exception", trace.WithAttributes(event...))
	span.SetStatus(codes.Error, desc)
}

// failure reports whether an outcome is a failure of the call: every
// outcome but a result or refusal returned (executed, refused, replayed).
func failure(o idem.Outcome) bool {
	switch o {
	case idem.OutcomeExecuted, idem.OutcomeRefused, idem.OutcomeReplayed:
		return false
	}
	return true
}

// isError reports whether the call's span gets status Error: the call
// failed on the server's side (failed, outcome_unknown) or was called
// wrongly (invalid). A key in progress or reused for another request is the
// client's condition, as a 4xx is for an HTTP server span: status unset,
// error.type set. Under idemhttp, an answer below 500 (a 400 for an invalid
// key, the handler's own 4xx that was not stored) is the client's too.
func isError(c *idem.CallEnd) bool {
	switch c.Outcome {
	case idem.OutcomeFailed, idem.OutcomeUnknown, idem.OutcomeInvalid:
		return c.HTTPStatus == 0 || c.HTTPStatus >= 500
	}
	return false
}

// setKey is what a call's metric attributes are made of.
type setKey struct {
	outcome   idem.Outcome
	refused   bool
	table     string
	operation string
	errType   string
	status    int
	resume    bool
}

// set returns the metric attributes of k, built once per distinct k.
func (o *Observer) set(k setKey) metric.MeasurementOption {
	o.mu.RLock()
	s, ok := o.sets[k]
	o.mu.RUnlock()
	if ok {
		return s
	}
	attrs := []attribute.KeyValue{
		OutcomeKey.String(k.outcome.String()),
		RefusedKey.Bool(k.refused),
		TableKey.String(k.table),
	}
	if k.operation != "" {
		attrs = append(attrs, OperationKey.String(k.operation))
	}
	if k.status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(k.status))
	}
	if k.errType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(k.errType))
	}
	if k.resume {
		attrs = append(attrs, ResumeKey.Bool(true))
	}
	s = metric.WithAttributeSet(attribute.NewSet(attrs...))
	o.mu.Lock()
	if len(o.sets) < maxCachedSets {
		o.sets[k] = s
	}
	o.mu.Unlock()
	return s
}

// splitScope splits the scope a key is stored under into Wrap's operation,
// if any, and the caller's scope: idem.Wrap stores its keys under
// "\x1f" + operation + "\x1f" + scope.
func splitScope(stored string) (operation, scope string) {
	if len(stored) > 1 && stored[0] == '\x1f' {
		if op, rest, ok := strings.Cut(stored[1:], "\x1f"); ok {
			return op, rest
		}
	}
	return "", stored
}
