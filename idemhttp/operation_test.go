package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/testdb"
)

// The operation under the handler in these tests: reserve (a database
// step), charge (an external step at a fake processor), receipt (a
// database step). Amounts above 1000 are refused with 402 after the
// reservation, an amount of 999 with no status; neither reaches the
// processor. The tables have no unique constraint, so a step that ran
// twice shows as two rows.
const opTables = `
CREATE TABLE op_reservations (key text NOT NULL, amount bigint NOT NULL);
CREATE TABLE op_receipts (key text NOT NULL, charge_id text NOT NULL);
`

type opRequest struct {
	Amount int64 `json:"amount"`
}

type opResult struct {
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
}

// opProcessor is a fake card processor that honours idempotency keys: the
// first call with a key charges, later ones return the same charge.
type opProcessor struct {
	mu      sync.Mutex
	charges map[string]string
	calls   int
	fail    int           // calls still to fail before acting
	entered chan struct{} // when set, receives once per call before it acts
	gate    chan struct{} // when set, each call waits for it before acting
}

var errProcessorDown = errors.New("processor: down")

func (p *opProcessor) charge(ctx context.Context, key string) (string, error) {
	p.mu.Lock()
	p.calls++
	entered, gate := p.entered, p.gate
	failing := p.fail > 0
	if failing {
		p.fail--
	}
	p.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if failing {
		return "", errProcessorDown
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.charges[key]
	if !ok {
		id = fmt.Sprintf("ch_%d", len(p.charges)+1)
		p.charges[key] = id
	}
	return id, nil
}

func (p *opProcessor) counts() (calls, charged int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, len(p.charges)
}

// opApp is a database with the operation's tables, the operation, and its
// handler routed at POST /charges and GET /charges/operations/{key}.
type opApp struct {
	pool    *pgxpool.Pool
	client  *idem.Client
	op      *idem.Operation[opRequest, opResult]
	proc    *opProcessor
	handler http.Handler
}

// userScope scopes keys by the X-User header; a request without it has no
// principal.
func userScope(r *http.Request) (string, error) {
	if u := r.Header.Get("X-User"); u != "" {
		return "user:" + u, nil
	}
	return "", errors.New("no user")
}

func statusURL(ref idem.OperationRef) string {
	return "/charges/operations/" + url.PathEscape(ref.Key)
}

func newOpApp(t *testing.T, cfg *idemhttp.Config, opts *idemhttp.OperationOptions[opRequest, opResult]) *opApp {
	t.Helper()
	a := &opApp{pool: testdb.New(t), proc: &opProcessor{charges: map[string]string{}}}
	if _, err := a.pool.Exec(context.Background(), opTables); err != nil {
		t.Fatal(err)
	}
	var err error
	if a.client, err = idem.NewClient(a.pool, nil); err != nil {
		t.Fatal(err)
	}
	if a.op, err = idem.NewOperation(a.client, "charge", a.charge, nil); err != nil {
		t.Fatal(err)
	}
	a.handler = a.serve(t, cfg, opts)
	return a
}

// serve returns the routes of a handler of a's operation built with cfg
// (nil: keys scoped by X-User) and opts (nil: StatusURL set).
func (a *opApp) serve(t *testing.T, cfg *idemhttp.Config, opts *idemhttp.OperationOptions[opRequest, opResult]) http.Handler {
	t.Helper()
	if cfg == nil {
		cfg = &idemhttp.Config{Scope: userScope, Logger: discardLogger()}
	}
	if opts == nil {
		opts = &idemhttp.OperationOptions[opRequest, opResult]{StatusURL: statusURL}
	}
	h, err := idemhttp.NewOperationHandler(a.op, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /charges", h)
	mux.HandleFunc("GET /charges/operations/{key}", h.ServeStatus)
	return mux
}

func (a *opApp) charge(s *idem.Steps, req opRequest) (opResult, error) {
	key := s.Key().Key
	if _, err := idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (int64, error) {
		_, err := tx.Exec(ctx, "INSERT INTO op_reservations VALUES ($1, $2)", key, req.Amount)
		return req.Amount, err
	}); err != nil {
		return opResult{}, err
	}
	switch {
	case req.Amount > 1000:
		return opResult{}, idem.Refuse("amount_too_large", "the amount is above the limit").WithStatus(http.StatusPaymentRequired)
	case req.Amount == 999:
		return opResult{}, idem.Refuse("amount_unlucky", "")
	}
	id, err := idem.External(s, "charge", a.proc.charge)
	if err != nil {
		return opResult{}, err
	}
	return idem.Step(s, "receipt", func(ctx context.Context, tx pgx.Tx) (opResult, error) {
		_, err := tx.Exec(ctx, "INSERT INTO op_receipts VALUES ($1, $2)", key, id)
		return opResult{ChargeID: id, Amount: req.Amount}, err
	})
}

// post sends POST /charges with key (none when "") as user (none when
// ""); header holds name, value pairs.
func (a *opApp) post(key, user, body string, header ...string) *httptest.ResponseRecorder {
	return a.send(a.handler, http.MethodPost, "/charges", key, user, body, header...)
}

// poll sends GET target as user.
func (a *opApp) poll(target, user string) *httptest.ResponseRecorder {
	return a.send(a.handler, http.MethodGet, target, "", user, "")
}

func (a *opApp) send(h http.Handler, method, target, key, user, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set(idemhttp.HeaderKey, key)
	}
	if user != "" {
		r.Header.Set("X-User", user)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func (a *opApp) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := a.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// rows counts the rows each database step wrote for key.
func (a *opApp) rows(t *testing.T, key string) (reservations, receipts int) {
	t.Helper()
	return a.count(t, "SELECT count(*) FROM op_reservations WHERE key = $1", key),
		a.count(t, "SELECT count(*) FROM op_receipts WHERE key = $1", key)
}

func (a *opApp) unfinished(t *testing.T) int {
	t.Helper()
	return a.count(t, "SELECT count(*) FROM idempotency_keys WHERE status = 'unfinished'")
}

// wantResult checks that w answers the result want, replayed or not.
func wantResult(t *testing.T, w *httptest.ResponseRecorder, want opResult, replayed bool) {
	t.Helper()
	wantStatus(t, w, http.StatusOK)
	wantReplayed(t, w, replayed)
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var got opResult
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got != want {
		t.Fatalf("body %q (%v), want %+v", w.Body.String(), err, want)
	}
}

// wantRefusal checks that w is the stored refusal code with status.
func wantRefusal(t *testing.T, w *httptest.ResponseRecorder, status int, code string, replayed bool) idemhttp.Problem {
	t.Helper()
	wantStatus(t, w, status)
	wantReplayed(t, w, replayed)
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	if p.Type != idemhttp.ProblemRefused || p.Status != status || p.Code != code || p.Title == "" {
		t.Fatalf("problem %+v, want type %s, status %d and code %s", p, idemhttp.ProblemRefused, status, code)
	}
	return p
}

// A retry with the same key and request replays the stored answer without
// running any step again: one reservation, one charge at the processor,
// one receipt. The request is what Decode returns, so the same JSON spelt
// otherwise is the same request.
func TestOperationHandlerReplays(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, nil, nil)
	want := opResult{ChargeID: "ch_1", Amount: 100}

	wantResult(t, a.post("k-replay", "ada", `{"amount":100}`), want, false)
	wantResult(t, a.post("k-replay", "ada", `{"amount":100}`), want, true)
	wantResult(t, a.post("k-replay", "ada", "{ \"amount\": 100 }\n"), want, true)

	if calls, charged := a.proc.counts(); calls != 1 || charged != 1 {
		t.Fatalf("processor: %d calls and %d charges, want 1 and 1", calls, charged)
	}
	if res, rec := a.rows(t, "k-replay"); res != 1 || rec != 1 {
		t.Fatalf("%d reservations and %d receipts, want 1 and 1", res, rec)
	}
	if n := a.unfinished(t); n != 0 {
		t.Fatalf("%d operations unfinished", n)
	}
}

// Another request under a used key is answered 422 and runs nothing.
func TestOperationHandlerMismatch(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, nil, nil)
	wantResult(t, a.post("k-mismatch", "ada", `{"amount":100}`), opResult{ChargeID: "ch_1", Amount: 100}, false)
	wantProblem(t, a.post("k-mismatch", "ada", `{"amount":200}`), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
	if calls, _ := a.proc.counts(); calls != 1 {
		t.Fatalf("processor: %d calls, want 1", calls)
	}
	if res, _ := a.rows(t, "k-mismatch"); res != 1 {
		t.Fatalf("%d reservations, want 1", res)
	}
}

// A refusal is the operation's answer: stored, answered with its own 4xx
// status (422 when it names none) and code, and replayed to every retry
// and to the status URL, without the operation running again.
func TestOperationHandlerRefusal(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, nil, nil)

	p := wantRefusal(t, a.post("k-refused", "ada", `{"amount":5000}`), http.StatusPaymentRequired, "amount_too_large", false)
	if p.Detail != "the amount is above the limit" {
		t.Fatalf("detail %q, want the refusal's message", p.Detail)
	}
	wantRefusal(t, a.post("k-refused", "ada", `{"amount":5000}`), http.StatusPaymentRequired, "amount_too_large", true)
	wantRefusal(t, a.poll("/charges/operations/k-refused", "ada"), http.StatusPaymentRequired, "amount_too_large", true)

	wantRefusal(t, a.post("k-unlucky", "ada", `{"amount":999}`), http.StatusUnprocessableEntity, "amount_unlucky", false)
	wantRefusal(t, a.post("k-unlucky", "ada", `{"amount":999}`), http.StatusUnprocessableEntity, "amount_unlucky", true)

	// In the service's own error format, with its own problem base.
	own := a.serve(t, &idemhttp.Config{Scope: userScope, ProblemBase: "https://errors.example.com/",
		WriteProblem: func(w http.ResponseWriter, _ *http.Request, p idemhttp.Problem) {
			w.WriteHeader(p.Status)
			fmt.Fprintf(w, "%s|%s|%s", p.Type, p.Code, p.Detail)
		}}, nil)
	w := a.send(own, http.MethodPost, "/charges", "k-refused", "ada", `{"amount":5000}`)
	if w.Code != http.StatusPaymentRequired || w.Body.String() != "https://errors.example.com/refused|amount_too_large|the amount is above the limit" {
		t.Fatalf("WriteProblem: %d %q", w.Code, w.Body.String())
	}

	if calls, _ := a.proc.counts(); calls != 0 {
		t.Fatalf("processor: %d calls, want 0", calls)
	}
	if res, _ := a.rows(t, "k-refused"); res != 1 {
		t.Fatalf("%d reservations, want 1: the refused operation ran again", res)
	}
	if n := a.count(t, "SELECT count(*) FROM idempotency_keys WHERE status = 'refused'"); n != 2 {
		t.Fatalf("%d refusals stored, want 2", n)
	}
}

// While the first request is inside the processor call, a duplicate is
// answered 409 at once; one that prefers respond-async, or any under a
// handler with Accepted, 202 with the status URL, which answers 202 until
// the operation finishes and then the stored answer. The duplicates never
// reach the processor.
func TestOperationHandlerInProgress(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, nil, nil)
	accepting := a.serve(t, nil, &idemhttp.OperationOptions[opRequest, opResult]{StatusURL: statusURL, Accepted: true})
	gate := make(chan struct{})
	a.proc.entered, a.proc.gate = make(chan struct{}, 1), gate
	body := `{"amount":100}`

	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- a.post("k-busy", "ada", body) }()
	<-a.proc.entered

	wantProblem(t, a.post("k-busy", "ada", body), http.StatusConflict, idemhttp.ProblemInProgress)
	if w := a.post("k-busy", "ada", body); w.Header().Get("Retry-After") != "1" {
		t.Fatalf("409 with Retry-After %q, want 1", w.Header().Get("Retry-After"))
	}
	for _, prefer := range []string{"respond-async", "wait=5, RESPOND-ASYNC", "respond-async; x=y"} {
		w := a.post("k-busy", "ada", body, "Prefer", prefer)
		wantStatus(t, w, http.StatusAccepted)
		if loc := w.Header().Get("Location"); loc != "/charges/operations/k-busy" {
			t.Fatalf("Prefer %q: Location %q", prefer, loc)
		}
		if w.Header().Get("Preference-Applied") != "respond-async" || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("Prefer %q: headers %v, want Preference-Applied and Retry-After", prefer, w.Header())
		}
	}
	wantProblem(t, a.post("k-busy", "ada", body, "Prefer", "handling=lenient"), http.StatusConflict, idemhttp.ProblemInProgress)
	w := a.send(accepting, http.MethodPost, "/charges", "k-busy", "ada", body)
	wantStatus(t, w, http.StatusAccepted)
	if w.Header().Get("Location") != "/charges/operations/k-busy" || w.Header().Get("Preference-Applied") != "" {
		t.Fatalf("Accepted: headers %v, want Location and no Preference-Applied", w.Header())
	}

	w = a.poll("/charges/operations/k-busy", "ada")
	wantStatus(t, w, http.StatusAccepted)
	if w.Header().Get("Retry-After") != "1" || w.Body.Len() != 0 {
		t.Fatalf("poll while unfinished: headers %v body %q", w.Header(), w.Body.String())
	}

	close(gate)
	want := opResult{ChargeID: "ch_1", Amount: 100}
	wantResult(t, <-first, want, false)
	wantResult(t, a.poll("/charges/operations/k-busy", "ada"), want, true)
	if calls, charged := a.proc.counts(); calls != 1 || charged != 1 {
		t.Fatalf("processor: %d calls and %d charges, want 1 and 1", calls, charged)
	}
}

// An operation that stopped on a step's error stays unfinished: the
// request is answered 500, or 202 with the status URL when it prefers
// respond-async, and a retry continues from the recorded steps: the
// reservation is not made again and the processor charges once.
func TestOperationHandlerStoppedOperation(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, nil, nil)
	a.proc.fail = 2
	body := `{"amount":100}`

	wantProblem(t, a.post("k-stop", "ada", body), http.StatusInternalServerError, idemhttp.ProblemInternal)
	if n := a.unfinished(t); n != 1 {
		t.Fatalf("%d operations unfinished, want 1", n)
	}
	w := a.post("k-stop", "ada", body, "Prefer", "respond-async")
	wantStatus(t, w, http.StatusAccepted)
	if loc := w.Header().Get("Location"); loc != "/charges/operations/k-stop" {
		t.Fatalf("Location %q", loc)
	}
	wantStatus(t, a.poll("/charges/operations/k-stop", "ada"), http.StatusAccepted)

	want := opResult{ChargeID: "ch_1", Amount: 100}
	wantResult(t, a.post("k-stop", "ada", body), want, false)
	wantResult(t, a.poll("/charges/operations/k-stop", "ada"), want, true)
	if res, rec := a.rows(t, "k-stop"); res != 1 || rec != 1 {
		t.Fatalf("%d reservations and %d receipts, want 1 and 1", res, rec)
	}
	if calls, charged := a.proc.counts(); calls != 3 || charged != 1 {
		t.Fatalf("processor: %d calls and %d charges, want 3 and 1", calls, charged)
	}
	if n := a.unfinished(t); n != 0 {
		t.Fatalf("%d operations unfinished", n)
	}
}

// A failure before the operation began (the database unreachable) leaves
// nothing to poll: it is answered 503 even to a client that prefers
// respond-async.
func TestOperationHandlerUnreachableDatabase(t *testing.T) {
	t.Parallel()
	client, err := idem.NewClient(unreachablePool(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	op, err := idem.NewOperation(client, "charge", func(*idem.Steps, opRequest) (opResult, error) {
		return opResult{}, errors.New("never runs")
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := idemhttp.NewOperationHandler(op, &idemhttp.Config{Scope: userScope, Logger: discardLogger()},
		&idemhttp.OperationOptions[opRequest, opResult]{StatusURL: statusURL})
	if err != nil {
		t.Fatal(err)
	}
	var a opApp
	for _, prefer := range []string{"", "respond-async"} {
		w := a.send(h, http.MethodPost, "/charges", "k-down", "ada", `{"amount":1}`, "Prefer", prefer)
		wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.ProblemUnavailable)
		if w.Header().Get("Location") != "" {
			t.Fatalf("Prefer %q: Location %q to an operation that never began", prefer, w.Header().Get("Location"))
		}
	}
}

// The status URL answers only within the poller's own scope: another
// principal polling the same key gets 404, never the first one's answer
// (and her own request under the key is her own operation); a poll
// without a principal is refused.
func TestOperationStatusScope(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, nil, nil)
	ada := opResult{ChargeID: "ch_1", Amount: 100}
	wantResult(t, a.post("k-shared", "ada", `{"amount":100}`), ada, false)

	wantProblem(t, a.poll("/charges/operations/k-shared", "grace"), http.StatusNotFound, idemhttp.ProblemNotFound)
	w := a.poll("/charges/operations/k-shared", "")
	wantProblem(t, w, http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
	if w.Header().Get("WWW-Authenticate") == "" {
		t.Fatal("401 without WWW-Authenticate")
	}
	wantProblem(t, a.poll("/charges/operations/k-never", "ada"), http.StatusNotFound, idemhttp.ProblemNotFound)
	wantResult(t, a.poll("/charges/operations/k-shared", "ada"), ada, true)

	grace := opResult{ChargeID: "ch_2", Amount: 100}
	wantResult(t, a.post("k-shared", "grace", `{"amount":100}`), grace, false)
	wantResult(t, a.poll("/charges/operations/k-shared", "grace"), grace, true)
	wantResult(t, a.poll("/charges/operations/k-shared", "ada"), ada, true)
}

// Requests the handler cannot run are refused with the middleware's
// problems, before anything is stored or any step runs.
func TestOperationHandlerRefusesBadRequests(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, &idemhttp.Config{Scope: userScope, MaxBodyBytes: 32, Logger: discardLogger()}, nil)
	for name, c := range map[string]struct {
		key, user, body string
		status          int
		typ             string
	}{
		"no key":         {"", "ada", `{"amount":1}`, http.StatusBadRequest, idemhttp.ProblemMissingKey},
		"invalid key":    {"a,b", "ada", `{"amount":1}`, http.StatusBadRequest, idemhttp.ProblemInvalidKey},
		"no principal":   {"k", "", `{"amount":1}`, http.StatusUnauthorized, idemhttp.ProblemUnauthorized},
		"body too large": {"k", "ada", `{"amount":1,"padding":"` + strings.Repeat("x", 40) + `"}`, http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge},
		"not JSON":       {"k", "ada", `amount=1`, http.StatusBadRequest, idemhttp.ProblemInvalidRequest},
		"wrong type":     {"k", "ada", `{"amount":"1"}`, http.StatusBadRequest, idemhttp.ProblemInvalidRequest},
		"unknown field":  {"k", "ada", `{"amout":1}`, http.StatusBadRequest, idemhttp.ProblemInvalidRequest},
		"trailing data":  {"k", "ada", `{"amount":1}{}`, http.StatusBadRequest, idemhttp.ProblemInvalidRequest},
	} {
		t.Run(name, func(t *testing.T) {
			wantProblem(t, a.post(c.key, c.user, c.body), c.status, c.typ)
		})
	}
	if n := a.count(t, "SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d keys stored", n)
	}
	if res, _ := a.rows(t, "k"); res != 0 {
		t.Fatalf("%d reservations", res)
	}
	wantProblem(t, a.poll("/charges/operations/"+url.PathEscape("bad\x01key"), "ada"), http.StatusBadRequest, idemhttp.ProblemInvalidKey)
}

// NewOperationHandler refuses at construction what would leave requests
// unprotected or settings silently unused: no scope, Config fields of the
// middleware's single transaction, Accepted without a status URL.
func TestNewOperationHandlerRefusesConfiguration(t *testing.T) {
	t.Parallel()
	client, err := idem.NewClient(unreachablePool(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	op, err := idem.NewOperation(client, "charge", func(*idem.Steps, opRequest) (opResult, error) { return opResult{}, nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	type opts = idemhttp.OperationOptions[opRequest, opResult]
	for name, c := range map[string]struct {
		client *idem.Client
		op     *idem.Operation[opRequest, opResult]
		cfg    *idemhttp.Config
		opts   *opts
		want   string
	}{
		"nil config":            {client, op, nil, nil, "Scope"},
		"no scope":              {client, op, &idemhttp.Config{}, nil, "Scope is not set"},
		"scope and shared keys": {client, op, &idemhttp.Config{Scope: userScope, SharedKeys: true}, nil, "SharedKeys"},
		"nil operation":         {client, nil, &idemhttp.Config{Scope: userScope}, nil, "nil Operation"},
		"negative body limit":   {client, op, &idemhttp.Config{Scope: userScope, MaxBodyBytes: -1}, nil, "MaxBodyBytes"},
		"methods":               {client, op, &idemhttp.Config{Scope: userScope, Methods: []string{"POST"}}, nil, "Methods"},
		"fingerprint":           {client, op, &idemhttp.Config{Scope: userScope, Fingerprint: idemhttp.DefaultFingerprint}, nil, "Fingerprint"},
		"fingerprint headers":   {client, op, &idemhttp.Config{Scope: userScope, FingerprintHeaders: []string{"X-Api-Version"}}, nil, "FingerprintHeaders"},
		"max response bytes":    {client, op, &idemhttp.Config{Scope: userScope, MaxResponseBytes: 10}, nil, "MaxResponseBytes"},
		"replay headers":        {client, op, &idemhttp.Config{Scope: userScope, ReplayHeaders: []string{"X-Id"}}, nil, "ReplayHeaders"},
		"store status":          {client, op, &idemhttp.Config{Scope: userScope, StoreStatus: idemhttp.DefaultStoreStatus}, nil, "StoreStatus"},
		"wait":                  {client, op, &idemhttp.Config{Scope: userScope, Wait: 1}, nil, "Wait"},
		"tx options":            {client, op, &idemhttp.Config{Scope: userScope, TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, nil, "TxOptions"},
		"observer":              {client, op, &idemhttp.Config{Scope: userScope, Observer: nopObserver{}}, nil, "Observer"},
		"accepted without url":  {client, op, &idemhttp.Config{Scope: userScope}, &opts{Accepted: true}, "StatusURL"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := idemhttp.NewOperationHandler(c.op, c.cfg, c.opts)
			if !errors.Is(err, idem.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want ErrInvalidOption saying %q", err, c.want)
			}
		})
	}
	for _, cfg := range []*idemhttp.Config{
		{Scope: userScope},
		{SharedKeys: true, Required: true, MaxBodyBytes: 10, RetryAfter: 2},
		{Scope: idemhttp.ContextScope, Key: idemhttp.KeyHeader("X-Delivery")},
	} {
		if _, err := idemhttp.NewOperationHandler(op, cfg, nil); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

type nopObserver struct{}

func (nopObserver) CallStart(ctx context.Context, _ idem.CallStart) context.Context { return ctx }
func (nopObserver) CallEnd(context.Context, idem.CallEnd)                           {}

// The handler's own Encode and Status shape every answer alike: the first,
// its replay, and the status URL's.
func TestOperationHandlerEncode(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, nil, &idemhttp.OperationOptions[opRequest, opResult]{
		StatusURL: statusURL,
		Status:    func(opResult) int { return http.StatusCreated },
		Encode: func(h http.Header, r opResult) ([]byte, error) {
			h.Set("Content-Type", "text/plain")
			h.Set("Location", "/charges/"+r.ChargeID)
			return []byte(r.ChargeID), nil
		},
	})
	for i, w := range []*httptest.ResponseRecorder{
		a.post("k-enc", "ada", `{"amount":7}`),
		a.post("k-enc", "ada", `{"amount":7}`),
		a.poll("/charges/operations/k-enc", "ada"),
	} {
		wantStatus(t, w, http.StatusCreated)
		wantReplayed(t, w, i > 0)
		if w.Header().Get("Location") != "/charges/ch_1" || !bytes.Equal(w.Body.Bytes(), []byte("ch_1")) {
			t.Fatalf("answer %d: headers %v body %q", i, w.Header(), w.Body.String())
		}
	}
}

// Every answer of the status URL says Cache-Control: no-store, the final
// result and refusal too: the state of the moment, never for a cache to
// keep or hand to another principal.
func TestOperationStatusIsNeverCached(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, nil, nil)
	wantResult(t, a.post("k-done", "ada", `{"amount":100}`), opResult{ChargeID: "ch_1", Amount: 100}, false)
	wantRefusal(t, a.post("k-refused", "ada", `{"amount":5000}`), http.StatusPaymentRequired, "amount_too_large", false)
	for _, target := range []string{"/charges/operations/k-done", "/charges/operations/k-refused", "/charges/operations/k-none"} {
		w := a.poll(target, "ada")
		if cc := w.Header().Get("Cache-Control"); cc != "no-store" {
			t.Errorf("GET %s: %d with Cache-Control %q, want no-store", target, w.Code, cc)
		}
	}
}

type taggedRequest struct {
	Tags map[string]int `json:"tags"`
}

// A body the default Decode accepts but whose request cannot be hashed
// exactly ({"a":1,"A":2} into a map: two keys equal under case folding) is
// bad input: 400, as the middleware answers a body it cannot fingerprint,
// never a 500 logged as the service's fault; nothing runs or is stored.
func TestOperationHandlerRequestItCannotHash(t *testing.T) {
	t.Parallel()
	a := newOpApp(t, nil, nil)
	ran := 0
	op, err := idem.NewOperation(a.client, "tagged", func(s *idem.Steps, req taggedRequest) (opResult, error) {
		ran++
		return opResult{}, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	h, err := idemhttp.NewOperationHandler(op, &idemhttp.Config{Scope: userScope,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError}))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := a.send(h, http.MethodPost, "/tags", "k-tags", "ada", `{"tags":{"a":1,"A":2}}`)
	wantProblem(t, w, http.StatusBadRequest, idemhttp.ProblemInvalidRequest)
	if ran != 0 || a.count(t, "SELECT count(*) FROM idempotency_keys") != 0 {
		t.Fatalf("the operation ran %d times; %d keys stored", ran, a.count(t, "SELECT count(*) FROM idempotency_keys"))
	}
	if logs.Len() != 0 {
		t.Fatalf("logged at ERROR: %s", logs.String())
	}
}
