package idemotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/idem"
)

// Observer hears of the steps of operations as well as of calls.
var _ idem.StepObserver = (*Observer)(nil)

// StepStart starts the step's span, idem.Step, a child of the span in ctx
// (the call's, for a step of an Operation's call), and returns ctx with
// it: spans the step's function starts from its context are the step
// span's children. It implements idem.StepObserver.
func (o *Observer) StepStart(ctx context.Context, s idem.StepStart) context.Context {
	ctx, _ = o.tracer.Start(ctx, StepSpanName, internalKind, trace.WithAttributes(o.stepAttrs(s.Table, s.Scope, s.Operation, s.Step, s.Kind)...))
	return ctx
}

// StepEnd records the step's duration in idem.step.duration and ends its
// span. A step recorded by an earlier owner, which did not run (s.Recorded,
// with no StepStart), gets a span of its own, started and ended here, and
// a duration of 0, both with idem.step.recorded true. An error from the
// step, other than a refusal, sets error.type and the span's status Error
// with an exception event (the text only under WithErrorMessages); a
// refusal sets idem.refused. It implements idem.StepObserver.
func (o *Observer) StepEnd(ctx context.Context, s idem.StepEnd) {
	var (
		errType string
		refused bool
	)
	if s.Err != nil {
		if _, ok := errors.AsType[*idem.Refusal](s.Err); ok {
			refused = true
		} else {
			errType = errorTypeOf(s.Err, 0)
		}
	}
	if o.stepDuration != nil {
		set := o.stepSet(stepSetKey{s.Table, s.Operation, s.Step, s.Kind, s.Recorded, refused, errType})
		o.stepDuration.Record(ctx, s.Duration.Seconds(), set)
	}

	span := trace.SpanFromContext(ctx)
	if s.Recorded {
		_, span = o.tracer.Start(ctx, StepSpanName, internalKind, trace.WithAttributes(o.stepAttrs(s.Table, s.Scope, s.Operation, s.Step, s.Kind)...))
	}
	if span.IsRecording() {
		var buf [3]attribute.KeyValue
		attrs := append(buf[:0], StepRecordedKey.Bool(s.Recorded), RefusedKey.Bool(refused))
		if errType != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(errType))
		}
		span.SetAttributes(attrs...)
		if errType != "" {
			o.recordErr(span, s.Err, errType)
		}
	}
	span.End()
}

// stepAttrs are a step span's attributes known when it starts.
func (o *Observer) stepAttrs(table, scope, operation, step string, kind idem.StepKind) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		TableKey.String(table),
		OperationKey.String(operation),
		StepKey.String(step),
		StepKindKey.String(kind.String()),
	}
	if o.scopeOnSpans {
		_, scope = splitScope(scope)
		attrs = append(attrs, ScopeKey.String(scope))
	}
	return attrs
}

// stepSetKey is what a step's metric attributes are made of.
type stepSetKey struct {
	table     string
	operation string
	step      string
	kind      idem.StepKind
	recorded  bool
	refused   bool
	errType   string
}

// stepSet returns the metric attributes of k, built once per distinct k.
// Operations and step names come from the code, not from requests, so the
// sets are few.
func (o *Observer) stepSet(k stepSetKey) metric.MeasurementOption {
	o.mu.RLock()
	s, ok := o.stepSets[k]
	o.mu.RUnlock()
	if ok {
		return s
	}
	attrs := []attribute.KeyValue{
		TableKey.String(k.table),
		OperationKey.String(k.operation),
		StepKey.String(k.step),
		StepKindKey.String(k.kind.String()),
		StepRecordedKey.Bool(k.recorded),
		RefusedKey.Bool(k.refused),
	}
	if k.errType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(k.errType))
	}
	s = metric.WithAttributeSet(attribute.NewSet(attrs...))
	o.mu.Lock()
	if len(o.stepSets) < maxCachedSets {
		o.stepSets[k] = s
	}
	o.mu.Unlock()
	return s
}
