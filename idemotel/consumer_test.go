package idemotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/testkit/testdb"
)

type ackAll struct{}

func (ackAll) Ack(context.Context) error                  { return nil }
func (ackAll) Retry(context.Context, time.Duration) error { return nil }
func (ackAll) DeadLetter(context.Context, error) error    { return nil }

// TestMessageSpans: a message's span continues the producer's trace from
// its headers, the call's span is its child, and a dead letter is an
// error.
func TestMessageSpans(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })

	tm := newTelemetry(t)
	obs := tm.observer()
	keys, err := idem.NewClient(testdb.New(t), &idem.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemconsume.New(keys, &idemconsume.Config{Name: "ledger", Observer: obs, MaxDeliveries: 1},
		func(_ context.Context, _ pgx.Tx, m *idemconsume.Message) error {
			if string(m.Payload) == "poison" {
				return errors.New("poison")
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx, producer := tm.tp.Tracer("producer").Start(t.Context(), "publish")
	headers := map[string]string{}
	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(headers))
	producer.End()

	for _, payload := range []string{"ok", "poison"} {
		m := &idemconsume.Message{ID: payload, Payload: []byte(payload), Headers: headers}
		if _, err := c.Process(t.Context(), m, ackAll{}); err != nil {
			t.Fatal(err)
		}
	}
	var msgs, calls []trace.SpanContext
	var parents []trace.SpanContext
	for _, s := range tm.spans.Ended() {
		switch s.Name() {
		case "ledger" + idemotel.ConsumerSpanSuffix:
			if s.SpanKind() != trace.SpanKindConsumer || s.Parent().TraceID() != producer.SpanContext().TraceID() {
				t.Errorf("message span: kind %v, parent %v; want a consumer span in the producer's trace", s.SpanKind(), s.Parent())
			}
			wantErr := len(msgs) == 1 // the second is the dead letter
			if got := s.Status().Code == codes.Error; got != wantErr {
				t.Errorf("message span %d: status %v", len(msgs), s.Status())
			}
			msgs = append(msgs, s.SpanContext())
		case idemotel.SpanName:
			calls = append(calls, s.SpanContext())
			parents = append(parents, s.Parent())
		}
	}
	if len(msgs) != 2 || len(calls) != 2 {
		t.Fatalf("%d message spans and %d call spans, want 2 each", len(msgs), len(calls))
	}
	for i := range calls {
		if parents[i].SpanID() != msgs[i].SpanID() {
			t.Errorf("call span %d is not the message span's child", i)
		}
	}
}
