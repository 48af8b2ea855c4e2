package idemotel_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/testkit/faultproxy"
	"github.com/idemhq/idem/testkit/testdb"
)

// request is what each call asks of the work: Act is ok, refuse, fail or
// hold; a different Variant makes it another request under the same key.
type request struct {
	Act     string `json:"act"`
	Variant int    `json:"variant"`
}

// world is one test's database, reached through a fault proxy, and the
// telemetry pipeline.
type world struct {
	t       *testing.T
	tm      *telemetry
	pool    *pgxpool.Pool
	proxy   *faultproxy.Proxy
	entered chan struct{} // a held call has claimed its key
	release chan struct{} // lets held calls finish
}

func newWorld(t *testing.T) *world {
	t.Helper()
	u := testdb.URL(t)
	hp, err := testdb.HostPort(u)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(hp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	pool, err := pgxpool.New(context.Background(), testdb.WithHostPort(u, proxy.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &world{t: t, tm: newTelemetry(t), pool: pool, proxy: proxy, entered: make(chan struct{}), release: make(chan struct{})}
}

// work is the business work of every entry point. ctx is the call's
// context when callCtx is set (Run, Wrap and idemhttp give one): a span
// started from it must be a child of the call's span. A failure quotes the
// key, as careless code does.
func (w *world) work(ctx context.Context, callCtx bool, tx pgx.Tx, key string, r request) (int, error) {
	if callCtx {
		_, span := w.tm.tp.Tracer("test").Start(ctx, "work")
		defer span.End()
	}
	if _, err := tx.Exec(ctx, "select 1"); err != nil {
		return 0, err
	}
	switch r.Act {
	case "refuse":
		return 0, idem.Refuse("declined", "card declined").WithStatus(http.StatusPaymentRequired)
	case "fail":
		return 0, fmt.Errorf("charging under key %s failed", key)
	case "hold":
		w.entered <- struct{}{}
		<-w.release
	}
	return 1, nil
}

// An entry is one way into idem: call makes one call with key and r under
// ctx and reports the HTTP status answered (0 outside idemhttp).
type entry struct {
	name string
	http bool
	call func(ctx context.Context, key string, r request) int
}

func (w *world) entries() []entry {
	t := w.t
	hash := func(r request) string {
		h, err := idem.HashJSON(r)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	// The acceptance form: an Observer passed per call, on a Client with the
	// defaults (the pool itself is refused beside the Client with settings
	// below).
	obs := w.tm.observer()
	plain, err := idem.NewClient(w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	do := entry{name: "Do", call: func(ctx context.Context, key string, r request) int {
		_, _ = idem.Do(ctx, plain, key, hash(r), func(tx pgx.Tx) (int, error) {
			return w.work(ctx, false, tx, key, r)
		}, idem.WithObserver(obs))
		return 0
	}}

	keys, err := idem.NewClient(w.pool, &idem.Config{Observer: w.tm.observer()})
	if err != nil {
		t.Fatal(err)
	}
	charge := idem.Wrap(keys, "payments.charge", func(ctx context.Context, tx pgx.Tx, r request) (int, error) {
		k, _ := idem.KeyFromContext(ctx)
		return w.work(ctx, true, tx, k.Key, r)
	})
	wrap := entry{name: "Wrap", call: func(ctx context.Context, key string, r request) int {
		_, _, _ = charge(ctx, key, r)
		return 0
	}}

	handler := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		var r request
		if err := json.NewDecoder(req.Body).Decode(&r); err != nil {
			http.Error(rw, "bad body", http.StatusBadRequest)
			return
		}
		k, _ := idem.KeyFromContext(req.Context())
		_, err := w.work(req.Context(), true, idemhttp.Tx(req.Context()), k.Key, r)
		switch {
		case idem.Retryable(err) || err == nil:
			rw.WriteHeader(http.StatusCreated)
		case strings.Contains(err.Error(), "declined"):
			rw.WriteHeader(http.StatusPaymentRequired)
		default:
			rw.WriteHeader(http.StatusInternalServerError)
		}
	})
	quiet := slog.New(slog.DiscardHandler) // the middleware logs its 5xx
	serve := func(h http.Handler) func(ctx context.Context, key string, r request) int {
		return func(ctx context.Context, key string, r request) int {
			body, _ := json.Marshal(r)
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", bytes.NewReader(body))
			req.Header.Set(idemhttp.HeaderKey, key)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec.Code
		}
	}
	mw, err := idemhttp.NewMiddleware(plain, &idemhttp.Config{SharedKeys: true, Observer: w.tm.observer(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mwClient, err := idemhttp.NewMiddleware(keys, &idemhttp.Config{SharedKeys: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}

	return []entry{
		do,
		wrap,
		{name: "idemhttp Config.Observer", http: true, call: serve(mw.Handler(handler))},
		{name: "idemhttp Client", http: true, call: serve(mwClient.Handler(handler))},
	}
}

// secret returns a distinctive random string that tests search for in
// everything exported.
func secret(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

// want is what one call must leave: one count, one duration and one span,
// with these attributes.
type want struct {
	outcome   idem.Outcome
	refused   bool
	status    int    // the HTTP status under idemhttp
	errorType string // "" for none
	spanError bool   // span status Error, with an exception event
}

// TestEveryOutcomeOnce drives every outcome through every entry point (Do,
// Wrap, and idemhttp with its three ways of getting an observer) and checks
// that each call is counted once, timed once and traced by exactly one span,
// a child of the caller's span, with its outcome; and that neither the key
// nor the scope appears in anything exported.
func TestEveryOutcomeOnce(t *testing.T) {
	w := newWorld(t)
	keySecret := secret(t, "key")
	scopeSecret := secret(t, "tenant")
	for i, e := range w.entries() {
		key := func(n string) string { return fmt.Sprintf("%s-%d-%s", keySecret, i, n) }
		run := func(name, k string, r request, wt want) {
			t.Helper()
			before, seen := w.tm.counts(t), len(w.tm.ended())
			ctx, parent := w.tm.tp.Tracer("test").Start(idem.ContextWithScope(context.Background(), scopeSecret), "caller")
			status := e.call(ctx, k, r)
			parent.End()
			w.check(e, name, wt, status, parent, before, seen)
		}

		run("executed", key("a"), request{Act: "ok"}, want{outcome: idem.OutcomeExecuted, status: 201})
		run("replayed", key("a"), request{Act: "ok"}, want{outcome: idem.OutcomeReplayed, status: 201})
		run("mismatch", key("a"), request{Act: "ok", Variant: 1}, want{outcome: idem.OutcomeMismatch, status: 422, errorType: "idem.ErrMismatch"})
		run("refused", key("b"), request{Act: "refuse"}, want{outcome: idem.OutcomeRefused, refused: true, status: 402})
		run("replayed refusal", key("b"), request{Act: "refuse"}, want{outcome: idem.OutcomeReplayed, refused: true, status: 402})
		failType := "*errors.errorString"
		if e.http {
			failType = "500" // the handler's 500, not stored
		}
		run("failed", key("c"), request{Act: "fail"}, want{outcome: idem.OutcomeFailed, status: 500, errorType: failType, spanError: true})

		// In progress: a first call holds the key while a second arrives.
		held := make(chan struct{})
		go func() {
			defer close(held)
			e.call(idem.ContextWithScope(context.Background(), scopeSecret), key("d"), request{Act: "hold"})
		}()
		<-w.entered
		run("in progress", key("d"), request{Act: "hold"}, want{outcome: idem.OutcomeInProgress, status: 409, errorType: "idem.ErrInProgress"})
		before, seen := w.tm.counts(t), len(w.tm.ended())
		w.release <- struct{}{}
		<-held
		w.check(e, "holder", want{outcome: idem.OutcomeExecuted, status: 201}, 201, nil, before, seen)

		// Outcome unknown: COMMIT is carried out, its answer is lost.
		w.proxy.SetRule(faultproxy.Once(faultproxy.ServerTag("COMMIT"), faultproxy.CutBefore))
		run("outcome unknown", key("e"), request{Act: "ok"}, want{outcome: idem.OutcomeUnknown, status: 503, errorType: "idem.ErrOutcomeUnknown", spanError: true})
		run("after outcome unknown", key("e"), request{Act: "ok"}, want{outcome: idem.OutcomeReplayed, status: 201})

		invalid := want{outcome: idem.OutcomeInvalid, errorType: "idem.ErrInvalidKey", spanError: true}
		if e.http {
			// A 400 is the client's error: status unset.
			invalid = want{outcome: idem.OutcomeInvalid, status: 400, errorType: "idemhttp.invalid-key"}
		}
		run("invalid", key("f\x01"), request{Act: "ok"}, invalid)
	}

	dump := w.tm.dump(t)
	for _, s := range []string{keySecret, scopeSecret} {
		if strings.Contains(dump, s) {
			t.Fatalf("%q was exported:\n%s", s, dump)
		}
	}
	if !strings.Contains(dump, "idem.outcome=outcome_unknown") || !strings.Contains(dump, "idem.operation=payments.charge") {
		t.Fatalf("the dump misses what it should hold:\n%s", dump)
	}
}

// check asserts that exactly one call was counted, timed and traced since
// before and seen, as wt says. parent, if not nil, is the caller's span.
func (w *world) check(e entry, name string, wt want, status int, parent trace.Span, before counts, seen int) {
	t := w.t
	t.Helper()
	where := e.name + " " + name
	if e.http && status != wt.status {
		t.Fatalf("%s: answered %d, want %d", where, status, wt.status)
	}

	kv := []attribute.KeyValue{
		idemotel.OutcomeKey.String(wt.outcome.String()),
		idemotel.RefusedKey.Bool(wt.refused),
		idemotel.TableKey.String(idem.DefaultTable),
	}
	if e.name == "Wrap" {
		kv = append(kv, idemotel.OperationKey.String("payments.charge"))
	}
	if e.http {
		kv = append(kv, attribute.Int("http.response.status_code", wt.status))
	}
	if wt.errorType != "" {
		kv = append(kv, attribute.String("error.type", wt.errorType))
	}
	wantSet := attrs(kv...)
	calls, durations := w.tm.counts(t).since(before)
	if len(calls) != 1 || calls[wantSet] != 1 || len(durations) != 1 || durations[wantSet] != 1 {
		t.Fatalf("%s: counted %v, timed %v; want one of each with %s", where, calls, durations, wantSet)
	}

	var spans []sdktrace.ReadOnlySpan
	var work sdktrace.ReadOnlySpan
	for _, s := range w.tm.ended()[seen:] {
		switch s.Name() {
		case idemotel.SpanName:
			spans = append(spans, s)
		case "work":
			work = s
		}
	}
	if len(spans) != 1 {
		t.Fatalf("%s: %d spans named %s, want 1", where, len(spans), idemotel.SpanName)
	}
	s := spans[0]
	if s.SpanKind() != trace.SpanKindInternal {
		t.Fatalf("%s: span kind %v, want internal", where, s.SpanKind())
	}
	if parent != nil && s.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("%s: the span's parent is %v, want the caller's span %v", where, s.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	if work != nil && work.Parent().SpanID() != s.SpanContext().SpanID() {
		t.Fatalf("%s: the work's span is not a child of the call's", where)
	}
	got := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes() {
		got[a.Key] = a.Value
	}
	for _, a := range append(kv, idemotel.WaitedKey.Bool(false)) {
		if v, ok := got[a.Key]; !ok || v != a.Value {
			t.Fatalf("%s: span attribute %s = %v, want %v (all: %v)", where, a.Key, v.String(), a.Value.String(), s.Attributes())
		}
	}
	if _, ok := got[idemotel.ScopeKey]; ok {
		t.Fatalf("%s: the span carries the scope without WithScopeOnSpans", where)
	}
	wantCode := codes.Unset
	if wt.spanError {
		wantCode = codes.Error
	}
	if s.Status().Code != wantCode {
		t.Fatalf("%s: span status %v %q, want %v", where, s.Status().Code, s.Status().Description, wantCode)
	}
	exceptions := 0
	for _, ev := range s.Events() {
		if ev.Name == "exception" {
			exceptions++
		}
	}
	if (exceptions == 1) != wt.spanError || exceptions > 1 {
		t.Fatalf("%s: %d exception events, span error %v", where, exceptions, wt.spanError)
	}
}

// TestScopeAndMessagesOptIn checks the two options that export client
// data: the scope on spans (never on metrics), and error messages.
func TestScopeAndMessagesOptIn(t *testing.T) {
	tm := newTelemetry(t)
	pool := testdb.New(t)
	obs := tm.observer(idemotel.WithScopeOnSpans(true), idemotel.WithErrorMessages(true))
	scope := secret(t, "tenant")
	key := secret(t, "key")
	ctx := idem.ContextWithScope(context.Background(), scope)
	_, err := idem.Do(ctx, pool, key, "h", func(pgx.Tx) (int, error) {
		return 0, fmt.Errorf("charging under key %s failed", key)
	}, idem.WithObserver(obs))
	if err == nil {
		t.Fatal("no error")
	}
	charge := idem.Wrap(pool, "payments.charge", func(context.Context, pgx.Tx, int) (int, error) { return 1, nil }, idem.WithObserver(obs))
	if _, _, err := charge(ctx, key, 1); err != nil {
		t.Fatal(err)
	}
	spans := tm.ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	for _, s := range spans {
		var got string
		for _, a := range s.Attributes() {
			if a.Key == idemotel.ScopeKey {
				got = a.Value.AsString()
			}
		}
		if got != scope {
			t.Fatalf("span idem.scope %q, want the caller's scope %q (for Wrap too, without the operation)", got, scope)
		}
	}
	if desc := spans[0].Status().Description; !strings.Contains(desc, key) {
		t.Fatalf("status description %q: WithErrorMessages records the error's text", desc)
	}
	rm := tm.collect(t)
	if text := fmt.Sprintf("%+v", rm); strings.Contains(text, scope) {
		t.Fatalf("the scope reached the metrics: %s", text)
	}
}

// TestPanicEndsSpan checks that a call whose fn panics still ends its span,
// as an error of type "panic", and is counted once.
func TestPanicEndsSpan(t *testing.T) {
	tm := newTelemetry(t)
	pool := testdb.New(t)
	func() {
		defer func() { _ = recover() }()
		_, _ = idem.Do(context.Background(), pool, "k", "h", func(pgx.Tx) (int, error) { panic("bug") }, idem.WithObserver(tm.observer()))
	}()
	spans := tm.ended()
	if len(spans) != 1 || spans[0].Status().Code != codes.Error {
		t.Fatalf("%d spans ended (status %v), want one, an error", len(spans), spans)
	}
	want := attrs(idemotel.OutcomeKey.String("failed"), idemotel.RefusedKey.Bool(false),
		idemotel.TableKey.String(idem.DefaultTable), attribute.String("error.type", "panic"))
	if c := tm.counts(t); len(c.calls) != 1 || c.calls[want] != 1 {
		t.Fatalf("counted %v, want one call with %s", c.calls, want)
	}
}
