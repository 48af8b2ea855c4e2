package idemotel_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/testkit/testdb"
)

// stepWorld is an operation of three steps, reserve (database), charge
// (external) and receipt (database), on a Client whose Observer is
// idemotel's. failCharge makes the next charges fail, quoting the key they
// were given; an amount above 1000 is refused by the charge step.
type stepWorld struct {
	tm         *telemetry
	op         *idem.Operation[int, string]
	failCharge atomic.Int64
	charges    atomic.Int64
}

func newStepWorld(t *testing.T, opts ...idemotel.Option) *stepWorld {
	t.Helper()
	w := &stepWorld{tm: newTelemetry(t)}
	pool := testdb.New(t)
	client, err := idem.NewClient(pool, &idem.Config{Observer: w.tm.observer(opts...)})
	if err != nil {
		t.Fatal(err)
	}
	inner := func(ctx context.Context) {
		// A span the step's own code starts: a child of the step's.
		_, span := w.tm.tp.Tracer("test").Start(ctx, "work")
		span.End()
	}
	w.op, err = idem.NewOperation(client, "payments.charge", func(s *idem.Steps, amount int) (string, error) {
		if _, err := idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (int, error) {
			inner(ctx)
			_, err := tx.Exec(ctx, "select 1")
			return amount, err
		}); err != nil {
			return "", err
		}
		id, err := idem.External(s, "charge", func(ctx context.Context, key string) (string, error) {
			inner(ctx)
			if amount > 1000 {
				return "", idem.Refuse("amount_too_large", "above the limit")
			}
			if w.failCharge.Add(-1) >= 0 {
				return "", fmt.Errorf("processor refused the connection for key %s", key)
			}
			w.charges.Add(1)
			return "ch_1", nil
		})
		if err != nil {
			return "", err
		}
		return idem.Step(s, "receipt", func(ctx context.Context, tx pgx.Tx) (string, error) {
			inner(ctx)
			_, err := tx.Exec(ctx, "select 1")
			return id, err
		})
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// run calls the operation under a caller's span and returns the span.
func (w *stepWorld) run(t *testing.T, scope, key string, amount int) (trace.Span, idem.Outcome) {
	t.Helper()
	ctx, parent := w.tm.tp.Tracer("test").Start(idem.ContextWithScope(context.Background(), scope), "caller")
	_, outcome, _ := w.op.Run(ctx, key, amount)
	parent.End()
	return parent, outcome
}

// stepSpan is what a test expects of one step's span.
type stepSpan struct {
	step     string
	kind     string
	recorded bool
	refused  bool
	errType  string // "" for none: status unset
}

// wantStepSpans checks the spans ended since seen: one call span, a child
// of caller, and one idem.Step span per step in order, each a child of the
// call span, with its attributes, and each step that ran with the span its
// code started as a child.
func (w *stepWorld) wantStepSpans(t *testing.T, seen int, caller trace.Span, want ...stepSpan) {
	t.Helper()
	var call sdktrace.ReadOnlySpan
	var steps, work []sdktrace.ReadOnlySpan
	for _, s := range w.tm.ended()[seen:] {
		switch s.Name() {
		case idemotel.SpanName:
			call = s
		case idemotel.StepSpanName:
			steps = append(steps, s)
		case "work":
			work = append(work, s)
		}
	}
	if call == nil || call.Parent().SpanID() != caller.SpanContext().SpanID() {
		t.Fatalf("no call span, a child of the caller's: %v", call)
	}
	if len(steps) != len(want) {
		t.Fatalf("%d step spans, want %d", len(steps), len(want))
	}
	ran := 0
	for i, s := range steps {
		wt := want[i]
		if s.Parent().SpanID() != call.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindInternal {
			t.Fatalf("step %s: parent %v kind %v; want a child of the call span, internal", wt.step, s.Parent().SpanID(), s.SpanKind())
		}
		got := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes() {
			got[a.Key] = a.Value
		}
		kv := []attribute.KeyValue{
			idemotel.TableKey.String(idem.DefaultTable),
			idemotel.OperationKey.String("payments.charge"),
			idemotel.StepKey.String(wt.step),
			idemotel.StepKindKey.String(wt.kind),
			idemotel.StepRecordedKey.Bool(wt.recorded),
			idemotel.RefusedKey.Bool(wt.refused),
		}
		if wt.errType != "" {
			kv = append(kv, attribute.String("error.type", wt.errType))
		} else if _, ok := got["error.type"]; ok {
			t.Fatalf("step %s: error.type %v, want none", wt.step, got["error.type"])
		}
		for _, a := range kv {
			if v, ok := got[a.Key]; !ok || v != a.Value {
				t.Fatalf("step %s: attribute %s = %v, want %v (all: %v)", wt.step, a.Key, v.String(), a.Value.String(), s.Attributes())
			}
		}
		if _, ok := got[idemotel.ScopeKey]; ok {
			t.Fatalf("step %s: the span carries the scope without WithScopeOnSpans", wt.step)
		}
		if wantCode := map[bool]codes.Code{true: codes.Error, false: codes.Unset}[wt.errType != ""]; s.Status().Code != wantCode {
			t.Fatalf("step %s: status %v, want %v", wt.step, s.Status().Code, wantCode)
		}
		if !wt.recorded {
			found := false
			for _, ws := range work[ran:] {
				if ws.Parent().SpanID() == s.SpanContext().SpanID() {
					found = true
				}
			}
			if !found {
				t.Fatalf("step %s: the span its code started is not its child", wt.step)
			}
			ran++
		}
	}
	if len(work) != ran {
		t.Fatalf("%d spans of the steps' code, want %d: a recorded step ran", len(work), ran)
	}
}

// stepDurations is the number of idem.step.duration records by attribute
// set, and whether every recorded step's duration was 0.
func (w *stepWorld) stepDurations(t *testing.T) (map[string]uint64, bool) {
	t.Helper()
	counts := map[string]uint64{}
	zero := true
	for _, sm := range w.tm.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != idemotel.MetricStepDuration {
				continue
			}
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok || m.Unit != "s" {
				t.Fatalf("%s: %T unit %q; want a float64 histogram in s", m.Name, m.Data, m.Unit)
			}
			for _, dp := range h.DataPoints {
				counts[encode(dp.Attributes)] = dp.Count
				if v, _ := dp.Attributes.Value(idemotel.StepRecordedKey); v.AsBool() && dp.Sum != 0 {
					zero = false
				}
			}
		}
	}
	return counts, zero
}

func stepSet(step, kind string, recorded, refused bool, errType string) string {
	kv := []attribute.KeyValue{
		idemotel.TableKey.String(idem.DefaultTable),
		idemotel.OperationKey.String("payments.charge"),
		idemotel.StepKey.String(step),
		idemotel.StepKindKey.String(kind),
		idemotel.StepRecordedKey.Bool(recorded),
		idemotel.RefusedKey.Bool(refused),
	}
	if errType != "" {
		kv = append(kv, attribute.String("error.type", errType))
	}
	return attrs(kv...)
}

// Every step that runs is one span, a child of its call's, that is the
// parent of what the step's code traces, and one duration; a replay of the
// finished operation runs no step and traces none.
func TestStepSpansAndDurations(t *testing.T) {
	w := newStepWorld(t)
	caller, outcome := w.run(t, "tenant", "k1", 100)
	if outcome != idem.OutcomeExecuted {
		t.Fatalf("outcome %v", outcome)
	}
	w.wantStepSpans(t, 0, caller,
		stepSpan{step: "reserve", kind: "database"},
		stepSpan{step: "charge", kind: "external"},
		stepSpan{step: "receipt", kind: "database"})

	seen := len(w.tm.ended())
	if _, outcome := w.run(t, "tenant", "k1", 100); outcome != idem.OutcomeReplayed {
		t.Fatalf("outcome %v, want replayed", outcome)
	}
	for _, s := range w.tm.ended()[seen:] {
		if s.Name() == idemotel.StepSpanName {
			t.Fatal("a replay of a finished operation traced a step")
		}
	}

	got, _ := w.stepDurations(t)
	want := map[string]uint64{
		stepSet("reserve", "database", false, false, ""): 1,
		stepSet("charge", "external", false, false, ""):  1,
		stepSet("receipt", "database", false, false, ""): 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("step durations %v, want %v", got, want)
	}
}

// An operation that stopped on its external step and was resumed: the
// failed step's span is an error with error.type and no message; the
// resumed call traces the recorded step as recorded (it did not run, and
// its duration is 0) and the others as they ran; a refusal from a step is
// not an error. Neither the key, the derived key, nor the scope is
// exported.
func TestStepRecordedFailedAndRefused(t *testing.T) {
	w := newStepWorld(t)
	key := secret(t, "key")
	scope := secret(t, "tenant")
	w.failCharge.Store(1)

	caller, outcome := w.run(t, scope, key, 100)
	if outcome != idem.OutcomeFailed {
		t.Fatalf("outcome %v, want failed", outcome)
	}
	w.wantStepSpans(t, 0, caller,
		stepSpan{step: "reserve", kind: "database"},
		stepSpan{step: "charge", kind: "external", errType: "*errors.errorString"})

	seen := len(w.tm.ended())
	caller, outcome = w.run(t, scope, key, 100)
	if outcome != idem.OutcomeExecuted || w.charges.Load() != 1 {
		t.Fatalf("outcome %v after %d charges, want executed after 1", outcome, w.charges.Load())
	}
	w.wantStepSpans(t, seen, caller,
		stepSpan{step: "reserve", kind: "database", recorded: true},
		stepSpan{step: "charge", kind: "external"},
		stepSpan{step: "receipt", kind: "database"})

	seen = len(w.tm.ended())
	caller, outcome = w.run(t, scope, key+"-large", 5000)
	if outcome != idem.OutcomeRefused {
		t.Fatalf("outcome %v, want refused", outcome)
	}
	w.wantStepSpans(t, seen, caller,
		stepSpan{step: "reserve", kind: "database"},
		stepSpan{step: "charge", kind: "external", refused: true})

	got, zero := w.stepDurations(t)
	want := map[string]uint64{
		stepSet("reserve", "database", false, false, ""):                   2,
		stepSet("reserve", "database", true, false, ""):                    1,
		stepSet("charge", "external", false, false, "*errors.errorString"): 1,
		stepSet("charge", "external", false, false, ""):                    1,
		stepSet("charge", "external", false, true, ""):                     1,
		stepSet("receipt", "database", false, false, ""):                   1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("step durations %v, want %v", got, want)
	}
	if !zero {
		t.Fatal("a recorded step has a duration other than 0")
	}

	dump := w.tm.dump(t)
	for _, s := range []string{key, scope} {
		if strings.Contains(dump, s) {
			t.Fatalf("%q was exported:\n%s", s, dump)
		}
	}
}

// WithScopeOnSpans and WithErrorMessages apply to step spans as to call
// spans: the scope on the span, never on the metric; the error's text on
// the span's status.
func TestStepOptIns(t *testing.T) {
	w := newStepWorld(t, idemotel.WithScopeOnSpans(true), idemotel.WithErrorMessages(true))
	scope := secret(t, "tenant")
	w.failCharge.Store(1)
	w.run(t, scope, "k", 100)
	var failed sdktrace.ReadOnlySpan
	for _, s := range w.tm.ended() {
		if s.Name() != idemotel.StepSpanName {
			continue
		}
		var got string
		for _, a := range s.Attributes() {
			if a.Key == idemotel.ScopeKey {
				got = a.Value.AsString()
			}
		}
		if got != scope {
			t.Fatalf("step span idem.scope %q, want %q", got, scope)
		}
		if s.Status().Code == codes.Error {
			failed = s
		}
	}
	if failed == nil || !strings.Contains(failed.Status().Description, "processor refused the connection") {
		t.Fatalf("the failed step's status does not carry its error's text: %v", failed)
	}
	if text := fmt.Sprintf("%+v", w.tm.collect(t)); strings.Contains(text, scope) {
		t.Fatal("the scope reached the metrics")
	}
}

// A completer's Resume is a call like a client's, marked idem.resume on
// its span and its metrics, so that operations the completer finishes show
// apart from the clients' calls.
func TestResumeIsMarked(t *testing.T) {
	w := newStepWorld(t)
	w.failCharge.Store(1)
	if _, outcome := w.run(t, "tenant", "k-resume", 100); outcome != idem.OutcomeFailed {
		t.Fatalf("outcome %v, want failed at the charge", outcome)
	}
	if outcome, err := w.op.Resume(context.Background(), "tenant", "k-resume"); err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("Resume: %v, %v", outcome, err)
	}
	resumed := 0
	for k, n := range w.tm.counts(t).calls {
		if strings.Contains(k, "idem.resume=true") {
			if !strings.Contains(k, "idem.outcome=executed") || n != 1 {
				t.Fatalf("resume calls %s: %d; want one executed", k, n)
			}
			resumed++
		}
	}
	if resumed != 1 {
		t.Fatalf("calls marked idem.resume: %d sets, want 1 (calls %v)", resumed, w.tm.counts(t).calls)
	}
	var marked int
	for _, s := range w.tm.ended() {
		for _, a := range s.Attributes() {
			if a.Key == idemotel.ResumeKey && a.Value.AsBool() {
				marked++
			}
		}
	}
	if marked != 1 {
		t.Fatalf("%d spans marked idem.resume, want Resume's call span", marked)
	}
}
