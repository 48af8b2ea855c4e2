package idemotel

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
)

// ConsumerSpanSuffix ends the name of the span of every message an
// idemconsume.Consumer processes: "<consumer name> process", the messaging
// conventions' "{operation} {destination}" with the consumer for the
// destination.
const ConsumerSpanSuffix = " process"

// ActionKey is what a consumer told the broker: idemconsume.Action's
// String, one of ack, retry, dead_letter.
const ActionKey = attribute.Key("idem.consumer.action")

// DeliveriesKey is the delivery's number, 1 for the first.
const DeliveriesKey = attribute.Key("idem.consumer.deliveries")

var consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)

// MessageStart starts the message's span, of kind consumer, continuing the
// producer's trace: its parent is the span context that the global
// propagator (otel.SetTextMapPropagator; W3C traceparent, say) finds in the
// message's headers, else the span in ctx. It implements
// idemconsume.Observer, so the same Observer goes in idem.Config.Observer
// and idemconsume.Config.Observer, and the call's span is the message's
// child.
func (o *Observer) MessageStart(ctx context.Context, consumer string, m *idemconsume.Message) context.Context {
	if len(m.Headers) > 0 {
		ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier(m.Headers))
	}
	ctx, _ = o.tracer.Start(ctx, consumer+ConsumerSpanSuffix, consumerKind, trace.WithAttributes(
		semconv.MessagingOperationTypeProcess, semconv.MessagingConsumerGroupName(consumer)))
	return ctx
}

// MessageEnd records how the delivery ended on its span and ends it: an
// error status for a dead letter, a failed handler and an unknown outcome;
// a key in progress elsewhere is not an error. It implements
// idemconsume.Observer. Counts per consumer are idemconsume.Counters'.
func (o *Observer) MessageEnd(ctx context.Context, e idemconsume.Event) {
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		span.SetAttributes(OutcomeKey.String(e.Outcome.String()), ActionKey.String(e.Action.String()),
			DeliveriesKey.Int(e.Deliveries))
		err := e.Err
		if err == nil {
			err = e.SettleErr
		}
		if e.Action == idemconsume.DeadLetter || e.SettleErr != nil ||
			e.Action == idemconsume.Retry && e.Outcome != idem.OutcomeInProgress {
			errType := errorTypeOf(err, 0)
			span.SetAttributes(semconv.ErrorTypeKey.String(errType))
			o.recordErr(span, err, errType)
		}
	}
	span.End()
}

var _ idemconsume.Observer = (*Observer)(nil)
