package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/faultproxy"
	"github.com/idemhq/idem/testkit/testdb"
)

// app is the service under the middleware in these tests: POST /charges
// inserts a charge through the request's transaction and answers by the
// amount it was given.
//
//	amount >= 0:  201 with Location, ETag, X-Request-Id and the charge as JSON
//	amount == -1: 402 (a refusal, after inserting)
//	amount == -2: 500 (after inserting), or 201 once failures is spent
//	amount == -3: panic (after inserting)
//
// GET /charges answers the number of charges and whether Tx was nil.
type app struct {
	pool     *pgxpool.Pool
	handler  http.Handler
	failures atomic.Int64  // how many -2 requests still fail
	runs     atomic.Int64  // handler executions of POST /charges
	gate     chan struct{} // when set, POST /charges waits for it after inserting
	entered  chan struct{} // when set, receives once POST /charges has inserted
}

type chargeRequest struct {
	Amount int `json:"amount"`
}

type charge struct {
	ID     int64  `json:"id"`
	Amount int    `json:"amount"`
	Owner  string `json:"owner"`
}

// newApp returns the app on a fresh database, under the middleware built
// with cfg (nil: the defaults), with keys shared by every client unless cfg
// sets a Scope.
func newApp(t *testing.T, cfg *idemhttp.Config) *app {
	t.Helper()
	return newConfigured(t, shared(cfg))
}

// shared returns cfg, or the defaults for nil, with SharedKeys set unless
// cfg has a Scope: for tests about something other than scopes.
func shared(cfg *idemhttp.Config) *idemhttp.Config {
	c := idemhttp.Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Scope == nil {
		c.SharedKeys = true
	}
	return &c
}

// handle returns h under the middleware on db built with cfg (see shared).
func handle(t *testing.T, db idem.Beginner, cfg *idemhttp.Config, h http.Handler) http.Handler {
	t.Helper()
	mw, err := idemhttp.NewMiddleware(db, shared(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return mw.Handler(h)
}

func (a *app) create(w http.ResponseWriter, r *http.Request) {
	a.runs.Add(1)
	tx := idemhttp.Tx(r.Context())
	if tx == nil {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	var req chargeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	c := charge{Amount: req.Amount, Owner: r.Header.Get("X-User")}
	if err := tx.QueryRow(r.Context(), "insert into charges (amount, owner) values ($1, $2) returning id",
		c.Amount, c.Owner).Scan(&c.ID); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if a.entered != nil {
		a.entered <- struct{}{}
	}
	if a.gate != nil {
		<-a.gate
	}
	switch {
	case c.Amount == -1:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusPaymentRequired)
		fmt.Fprint(w, `{"error":"card declined"}`)
		return
	case c.Amount == -2 && a.failures.Add(-1) >= 0:
		http.Error(w, "gateway down", http.StatusInternalServerError)
		return
	case c.Amount == -3:
		panic("handler bug")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/charges/"+strconv.FormatInt(c.ID, 10))
	w.Header().Set("ETag", `"`+strconv.FormatInt(c.ID, 10)+`"`)
	w.Header().Set("X-Request-Id", strconv.FormatInt(a.runs.Load(), 10))
	w.Header().Set("X-Charge-Amount", strconv.Itoa(c.Amount))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(c)
}

// post sends POST /charges with key (none when "") and the amount.
func (a *app) post(key string, amount int, header ...string) *httptest.ResponseRecorder {
	body, _ := json.Marshal(chargeRequest{Amount: amount})
	return a.send(http.MethodPost, "/charges", key, body, header...)
}

// send serves one request; header holds name, value pairs.
func (a *app) send(method, target, key string, body []byte, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, bytes.NewReader(body))
	if key != "" {
		r.Header.Set(idemhttp.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	a.handler.ServeHTTP(w, r)
	return w
}

func (a *app) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := a.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (a *app) charges(t *testing.T) int {
	t.Helper()
	return a.count(t, "select count(*) from charges")
}

func (a *app) keys(t *testing.T) int {
	t.Helper()
	return a.count(t, "select count(*) from idempotency_keys")
}

func wantStatus(t *testing.T, w *httptest.ResponseRecorder, status int) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %q", w.Code, status, w.Body.String())
	}
}

// wantProblem checks that w is the middleware's problem of type typ.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, typ string) idemhttp.Problem {
	t.Helper()
	wantStatus(t, w, status)
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body.String(), err)
	}
	if p.Type != typ || p.Status != status || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem %+v, want type %s and status %d with title and detail", p, typ, status)
	}
	if w.Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("a problem of the middleware carries %s", idemhttp.HeaderReplayed)
	}
	return p
}

func wantReplayed(t *testing.T, w *httptest.ResponseRecorder, replayed bool) {
	t.Helper()
	got := w.Header().Get(idemhttp.HeaderReplayed)
	if (got == "true") != replayed || (!replayed && got != "") {
		t.Fatalf("%s: %q, want replayed=%t", idemhttp.HeaderReplayed, got, replayed)
	}
}

// proxiedPool returns a pool on a new database through a fault proxy, and
// the proxy.
func proxiedPool(t *testing.T) (*pgxpool.Pool, *faultproxy.Proxy) {
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
	t.Cleanup(func() { _ = proxy.Close() })
	pool, err := pgxpool.New(context.Background(), testdb.WithHostPort(u, proxy.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, proxy
}
