package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

func TestCommitAndReplay(t *testing.T) {
	t.Parallel()
	a := newApp(t, &idemhttp.Config{ReplayHeaders: []string{"X-Charge-Amount"}})

	first := a.post("charge-1", 500)
	wantStatus(t, first, http.StatusCreated)
	wantReplayed(t, first, false)
	if first.Header().Get("X-Request-Id") == "" {
		t.Fatal("the first response lost a header the handler set")
	}

	second := a.post("charge-1", 500)
	wantStatus(t, second, http.StatusCreated)
	wantReplayed(t, second, true)
	if !bytes.Equal(first.Body.Bytes(), second.Body.Bytes()) {
		t.Fatalf("replayed body %q, want %q", second.Body, first.Body)
	}
	for _, h := range []string{"Content-Type", "Location", "ETag", "X-Charge-Amount"} {
		if got, want := second.Header().Get(h), first.Header().Get(h); got != want || want == "" {
			t.Errorf("replayed %s %q, want %q", h, got, want)
		}
	}
	if got := second.Header().Get("X-Request-Id"); got != "" {
		t.Errorf("X-Request-Id %q replayed; it is not a replay header", got)
	}
	if n := a.charges(t); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if n := a.count(t, "select count(*) from idempotency_keys where status = 'completed'"); n != 1 {
		t.Fatalf("%d completed keys, want 1", n)
	}
}

func TestRefusalStoredWritesRolledBack(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)

	first := a.post("declined", -1)
	wantStatus(t, first, http.StatusPaymentRequired)
	wantReplayed(t, first, false)
	second := a.post("declined", -1)
	wantStatus(t, second, http.StatusPaymentRequired)
	wantReplayed(t, second, true)
	if !bytes.Equal(first.Body.Bytes(), second.Body.Bytes()) || second.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("replay %q (%s), want %q (application/json)", second.Body, second.Header().Get("Content-Type"), first.Body)
	}
	if n := a.charges(t); n != 0 {
		t.Fatalf("%d charges after a refusal, want 0", n)
	}
	if n := a.count(t, "select count(*) from idempotency_keys where status = 'refused'"); n != 1 {
		t.Fatalf("%d refused keys, want 1", n)
	}
	if n := a.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

func TestServerErrorNotStored(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	a.failures.Store(1)

	first := a.post("flaky", -2)
	wantStatus(t, first, http.StatusInternalServerError)
	if !strings.Contains(first.Body.String(), "gateway down") {
		t.Fatalf("body %q, want the handler's own", first.Body)
	}
	if c, k := a.charges(t), a.keys(t); c != 0 || k != 0 {
		t.Fatalf("after a 500: %d charges and %d keys, want none", c, k)
	}

	retry := a.post("flaky", -2)
	wantStatus(t, retry, http.StatusCreated)
	wantReplayed(t, retry, false)
	if c, k := a.charges(t), a.keys(t); c != 1 || k != 1 {
		t.Fatalf("after the retry: %d charges and %d keys, want 1 and 1", c, k)
	}
}

func TestStoreStatus(t *testing.T) {
	t.Parallel()
	// Store successes only: a refusal frees the key like a 5xx.
	a := newApp(t, &idemhttp.Config{StoreStatus: func(status int) bool { return status < 400 }})
	wantStatus(t, a.post("k", -1), http.StatusPaymentRequired)
	wantStatus(t, a.post("k", -1), http.StatusPaymentRequired)
	if c, k, runs := a.charges(t), a.keys(t), a.runs.Load(); c != 0 || k != 0 || runs != 2 {
		t.Fatalf("%d charges, %d keys, %d runs; want 0, 0, 2", c, k, runs)
	}
}

func TestPanicLeavesNothing(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)

	func() {
		defer func() {
			if r := recover(); r != "handler bug" {
				t.Fatalf("recovered %v, want the handler's panic to propagate", r)
			}
		}()
		a.post("boom", -3)
	}()
	if c, k := a.charges(t), a.keys(t); c != 0 || k != 0 {
		t.Fatalf("after a panic: %d charges and %d keys, want none", c, k)
	}
	// The key is free: a retry of the same request runs again.
	func() {
		defer func() { _ = recover() }()
		a.post("boom", -3)
	}()
	if n := a.runs.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
}

func TestPanicThroughServer(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	srv := httptest.NewUnstartedServer(a.handler)
	srv.Config.ErrorLog = discardLog()
	srv.Start()
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":-3}`))
	req.Header.Set(idemhttp.HeaderKey, "boom")
	resp, err := srv.Client().Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d, want the connection closed by net/http's recovery", resp.StatusCode)
	}
	if c, k := a.charges(t), a.keys(t); c != 0 || k != 0 {
		t.Fatalf("after a panic: %d charges and %d keys, want none", c, k)
	}
}

func TestMismatch(t *testing.T) {
	t.Parallel()
	a := newApp(t, &idemhttp.Config{FingerprintHeaders: []string{"X-Api-Version"}})
	wantStatus(t, a.post("k", 100, "X-Api-Version", "1"), http.StatusCreated)

	t.Run("body", func(t *testing.T) {
		wantProblem(t, a.post("k", 200, "X-Api-Version", "1"), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
	})
	t.Run("path", func(t *testing.T) {
		w := a.send(http.MethodPost, "/charges?x=1", "k", []byte(`{"amount":100}`), "X-Api-Version", "1")
		wantProblem(t, w, http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
	})
	t.Run("fingerprint header", func(t *testing.T) {
		wantProblem(t, a.post("k", 100, "X-Api-Version", "2"), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
	})
	t.Run("other headers do not count", func(t *testing.T) {
		w := a.post("k", 100, "X-Api-Version", "1", "User-Agent", "other")
		wantStatus(t, w, http.StatusCreated)
		wantReplayed(t, w, true)
	})
	if n := a.charges(t); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

func TestInProgress(t *testing.T) {
	t.Parallel()
	a := newApp(t, &idemhttp.Config{RetryAfter: 2500 * time.Millisecond})
	a.gate = make(chan struct{})
	a.entered = make(chan struct{}, 1)
	openGate := sync.OnceFunc(func() { close(a.gate) })
	defer openGate() // on failure too: the first request holds a connection

	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- a.post("slow", 100) }()
	<-a.entered
	a.entered = nil // read by the first request only, before it signalled

	busy := a.postContended(t, "slow", 100)
	wantProblem(t, busy, http.StatusConflict, idemhttp.ProblemInProgress)
	if got := busy.Header().Get("Retry-After"); got != "3" {
		t.Fatalf("Retry-After %q, want 3 (2.5s rounded up)", got)
	}
	openGate()
	first := <-done
	wantStatus(t, first, http.StatusCreated)

	replay := a.post("slow", 100)
	wantReplayed(t, replay, true)
	if !bytes.Equal(replay.Body.Bytes(), first.Body.Bytes()) {
		t.Fatalf("replay %q, want %q", replay.Body, first.Body)
	}
	if n := a.charges(t); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	const n = 32
	var (
		start     = make(chan struct{})
		wg        sync.WaitGroup
		responses [n]*httptest.ResponseRecorder
	)
	// Bounded: every request is answered at once, 409 or a replay.
	ctx, cancel := context.WithTimeout(context.Background(), 3*contentionBound)
	defer cancel()
	for i := range n {
		wg.Go(func() {
			<-start
			responses[i] = a.postBounded(ctx, "race", 100)
		})
	}
	close(start)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("%d requests on one key were not all answered within %v", n, 3*contentionBound)
	}

	var created []*httptest.ResponseRecorder
	fresh := 0
	for _, w := range responses {
		switch w.Code {
		case http.StatusCreated:
			created = append(created, w)
			if w.Header().Get(idemhttp.HeaderReplayed) == "" {
				fresh++
			}
		case http.StatusConflict:
			wantProblem(t, w, http.StatusConflict, idemhttp.ProblemInProgress)
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	if fresh != 1 {
		t.Fatalf("%d responses were not replays, want exactly 1", fresh)
	}
	for _, w := range created {
		if !bytes.Equal(w.Body.Bytes(), created[0].Body.Bytes()) {
			t.Fatalf("bodies differ: %q and %q", w.Body, created[0].Body)
		}
	}
	if c, k := a.charges(t), a.keys(t); c != 1 || k != 1 {
		t.Fatalf("%d charges and %d keys, want 1 and 1", c, k)
	}
	if runs := a.runs.Load(); runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
}

func TestScopeIsolation(t *testing.T) {
	t.Parallel()
	a := newApp(t, &idemhttp.Config{Scope: func(r *http.Request) (string, error) {
		user := r.Header.Get("X-User")
		if user == "" {
			return "", errors.New("not signed in")
		}
		return "user:" + user, nil
	}})

	alice := a.post("shared-key", 100, "X-User", "alice")
	bob := a.post("shared-key", 100, "X-User", "bob")
	wantStatus(t, alice, http.StatusCreated)
	wantStatus(t, bob, http.StatusCreated)
	wantReplayed(t, bob, false)
	owner := func(w *httptest.ResponseRecorder) string {
		var c charge
		if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		return c.Owner
	}
	if owner(alice) != "alice" || owner(bob) != "bob" {
		t.Fatalf("owners %q and %q, want alice and bob", owner(alice), owner(bob))
	}
	for _, user := range []string{"alice", "bob"} {
		w := a.post("shared-key", 100, "X-User", user)
		wantReplayed(t, w, true)
		if got := owner(w); got != user {
			t.Fatalf("%s's replay returned %s's response", user, got)
		}
	}
	if c, k := a.charges(t), a.keys(t); c != 2 || k != 2 {
		t.Fatalf("%d charges and %d keys, want 2 and 2", c, k)
	}

	t.Run("no principal", func(t *testing.T) {
		wantProblem(t, a.post("shared-key", 100), http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
	})
}

func TestRequiredKey(t *testing.T) {
	t.Parallel()
	a := newApp(t, &idemhttp.Config{Required: true})
	wantProblem(t, a.post("", 100), http.StatusBadRequest, idemhttp.ProblemMissingKey)
	if runs := a.runs.Load(); runs != 0 {
		t.Fatalf("the handler ran %d times without a key", runs)
	}
	wantStatus(t, a.post("k", 100), http.StatusCreated)
	if c, k := a.charges(t), a.keys(t); c != 1 || k != 1 {
		t.Fatalf("%d charges and %d keys, want 1 and 1", c, k)
	}
}

func TestWithoutKey(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)

	wantStatus(t, a.post("", 100), http.StatusCreated)
	wantStatus(t, a.post("", 100), http.StatusCreated)
	wantStatus(t, a.post("", -1), http.StatusPaymentRequired) // rolls back
	wantStatus(t, a.post("", -2), http.StatusCreated)         // no failures left
	if c, k := a.charges(t), a.keys(t); c != 3 || k != 0 {
		t.Fatalf("%d charges and %d keys, want 3 and 0", c, k)
	}
	a.failures.Store(1)
	wantStatus(t, a.post("", -2), http.StatusInternalServerError) // rolls back
	if c := a.charges(t); c != 3 {
		t.Fatalf("%d charges, want 3", c)
	}
}

func TestUncoveredMethodPassesThrough(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	wantStatus(t, a.post("k", 100), http.StatusCreated)

	w := a.send(http.MethodGet, "/charges", "k", nil)
	wantStatus(t, w, http.StatusOK)
	if got := w.Body.String(); got != "charges=1 tx=false" {
		t.Fatalf("GET answered %q, want charges=1 tx=false", got)
	}
	wantReplayed(t, w, false)

	t.Run("Methods", func(t *testing.T) {
		b := newApp(t, &idemhttp.Config{Methods: []string{http.MethodGet}})
		if got := b.send(http.MethodGet, "/charges", "k", nil).Body.String(); got != "charges=0 tx=true" {
			t.Fatalf("GET answered %q, want charges=0 tx=true", got)
		}
		w := b.post("k2", 100)
		wantStatus(t, w, http.StatusInternalServerError) // POST is no longer covered: no transaction
		if n := b.keys(t); n != 1 {
			t.Fatalf("%d keys, want 1 (the GET's)", n)
		}
	})
}

func TestHeaderForms(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)

	quoted := a.send(http.MethodPost, "/charges", "", []byte(`{"amount":100}`),
		idemhttp.HeaderKey, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
	wantStatus(t, quoted, http.StatusCreated)
	wantReplayed(t, quoted, false)
	bare := a.post("8e03978e-40d5-43e8-bc93-6894a57f9324", 100)
	wantReplayed(t, bare, true) // the bare and quoted forms name one key
	if a.keys(t) != 1 {
		t.Fatal("want one key")
	}

	for name, header := range map[string][]string{
		"two lines":  {idemhttp.HeaderKey, "a", idemhttp.HeaderKey, "b"},
		"list":       {idemhttp.HeaderKey, `"a", "b"`},
		"empty":      {idemhttp.HeaderKey, ""},
		"too long":   {idemhttp.HeaderKey, strings.Repeat("k", 256)},
		"control":    {idemhttp.HeaderKey, "a\x01b"},
		"bad escape": {idemhttp.HeaderKey, `"a\b"`},
	} {
		t.Run(name, func(t *testing.T) {
			w := a.send(http.MethodPost, "/charges", "", []byte(`{"amount":1}`), header...)
			wantProblem(t, w, http.StatusBadRequest, idemhttp.ProblemInvalidKey)
		})
	}
	if n := a.charges(t); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 64
	var seen []byte
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
	})

	for _, key := range []string{"big", ""} {
		t.Run("over the limit, database untouched, key "+strconv.Quote(key), func(t *testing.T) {
			// The pool points at a closed port: any database work would fail
			// with 503, so 413 proves none was attempted.
			h := handle(t, unreachablePool(t), &idemhttp.Config{MaxBodyBytes: limit}, echo)
			r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(make([]byte, limit+1)))
			if key != "" {
				r.Header.Set(idemhttp.HeaderKey, key)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			wantProblem(t, w, http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
		})
	}
	t.Run("at the limit, body re-supplied", func(t *testing.T) {
		a := newApp(t, nil)
		h := handle(t, a.pool, &idemhttp.Config{MaxBodyBytes: limit}, echo)
		body := bytes.Repeat([]byte("x"), limit)
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		r.Header.Set(idemhttp.HeaderKey, "fits")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		wantStatus(t, w, http.StatusNoContent)
		if !bytes.Equal(seen, body) {
			t.Fatalf("the handler read %d bytes, want the %d the middleware read", len(seen), len(body))
		}
	})
}

func TestDatabaseUnavailable(t *testing.T) {
	t.Parallel()
	h := handle(t, unreachablePool(t), nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran without a database")
	}))
	for _, key := range []string{"k", ""} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		if key != "" {
			r.Header.Set(idemhttp.HeaderKey, key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.ProblemUnavailable)
		if got := w.Header().Get("Retry-After"); got != "1" {
			t.Fatalf("Retry-After %q, want 1", got)
		}
	}
}

// failingWriter is a client that has gone away: every write fails.
type failingWriter struct{ header http.Header }

func (f *failingWriter) Header() http.Header         { return f.header }
func (f *failingWriter) WriteHeader(int)             {}
func (f *failingWriter) Write(p []byte) (int, error) { return 0, errors.New("broken pipe") }

func TestBrokenClientStillCommits(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
	r.Header.Set(idemhttp.HeaderKey, "gone")
	a.handler.ServeHTTP(&failingWriter{header: http.Header{}}, r)
	if c, k := a.charges(t), a.keys(t); c != 1 || k != 1 {
		t.Fatalf("%d charges and %d keys, want 1 and 1", c, k)
	}
	wantReplayed(t, a.post("gone", 100), true)
}

func TestClientGoneBeforeStart(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
	r.Header.Set(idemhttp.HeaderKey, "left")
	w := httptest.NewRecorder()
	a.handler.ServeHTTP(w, r)
	wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.ProblemUnavailable)
	if c, k, runs := a.charges(t), a.keys(t), a.runs.Load(); c != 0 || k != 0 || runs != 0 {
		t.Fatalf("%d charges, %d keys, %d runs; want none", c, k, runs)
	}
}

func TestCustomFingerprint(t *testing.T) {
	t.Parallel()
	// Fingerprint the canonical JSON, so formatting does not matter.
	a := newApp(t, &idemhttp.Config{Fingerprint: func(r *http.Request, body []byte) (string, error) {
		return idem.HashJSONBytes(body)
	}})
	wantStatus(t, a.send(http.MethodPost, "/charges", "k", []byte(`{"amount":100}`)), http.StatusCreated)
	w := a.send(http.MethodPost, "/charges", "k", []byte(`{ "amount": 100.0 }`))
	wantReplayed(t, w, true)
	wantProblem(t, a.send(http.MethodPost, "/charges", "k2", []byte(`{"amount":`)), http.StatusBadRequest, idemhttp.ProblemInvalidRequest)
}

func TestClientConfig(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	keys, err := idem.NewClient(a.pool, &idem.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	a.handler = handle(t, keys, nil, http.HandlerFunc(a.create))
	wantStatus(t, a.post("k", 100), http.StatusCreated)
	if n := a.count(t, "select count(*) from idempotency_keys where expires_at < now() + interval '2 hours'"); n != 1 {
		t.Fatalf("%d keys expire within 2 hours, want 1 (TTL 1h)", n)
	}
}

func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	// Port 1 on the loopback refuses connections at once.
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }

func TestRetryLaterStatusesNotStored(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	limited := true
	h := handle(t, a.pool, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if limited {
			limited = false
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	for _, want := range []int{http.StatusTooManyRequests, http.StatusAccepted, http.StatusAccepted} {
		r := httptest.NewRequest(http.MethodPatch, "/jobs/1", strings.NewReader("{}"))
		r.Header.Set(idemhttp.HeaderKey, "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		wantStatus(t, w, want)
	}
	if n := a.keys(t); n != 1 {
		t.Fatalf("%d keys, want 1", n)
	}
}

func TestCapturedLikeNetHTTP(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	h := handle(t, a.pool, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Etag", `"v1"`)
		w.WriteHeader(http.StatusOK)
		w.Header().Set("Location", "/late") // after WriteHeader: net/http drops it
		fmt.Fprint(w, "<!DOCTYPE html><html><body>ok</body></html>")
	}))
	var bodies [2]string
	for i := range 2 {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(""))
		r.Header.Set(idemhttp.HeaderKey, "html")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		wantStatus(t, w, http.StatusOK)
		wantReplayed(t, w, i == 1)
		if ct := w.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Fatalf("response %d: Content-Type %q, want the sniffed text/html", i, ct)
		}
		if got := w.Header().Get("Location"); got != "" {
			t.Fatalf("response %d: Location %q set after WriteHeader was sent", i, got)
		}
		if got := w.Header().Get("Etag"); got != `"v1"` {
			t.Fatalf("response %d: ETag %q", i, got)
		}
		bodies[i] = w.Body.String()
	}
	if bodies[0] != bodies[1] {
		t.Fatalf("bodies %q and %q", bodies[0], bodies[1])
	}
}

// lossyCommit begins transactions on pool whose COMMIT reports a lost
// connection: after committing (commit true) or after rolling back.
type lossyCommit struct {
	pool   *pgxpool.Pool
	commit bool
}

func (l *lossyCommit) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &lossyTx{Tx: tx, commit: l.commit}, nil
}

type lossyTx struct {
	pgx.Tx
	commit bool
}

func (t *lossyTx) Commit(ctx context.Context) error {
	if t.commit {
		if err := t.Tx.Commit(ctx); err != nil {
			return err
		}
	} else {
		_ = t.Rollback(ctx)
	}
	return errors.New("read tcp 127.0.0.1:5432: connection reset by peer")
}

func TestOutcomeUnknown(t *testing.T) {
	t.Parallel()
	for _, committed := range []bool{true, false} {
		t.Run(fmt.Sprintf("committed=%t", committed), func(t *testing.T) {
			a := newApp(t, nil)
			lossy := &app{pool: a.pool}
			mux := http.NewServeMux()
			mux.HandleFunc("POST /charges", lossy.create)
			lossy.handler = handle(t, &lossyCommit{pool: a.pool, commit: committed}, &idemhttp.Config{Logger: discardLogger()}, mux)

			w := lossy.post("unsure", 100)
			wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.ProblemOutcomeUnknown)
			if w.Header().Get("Retry-After") == "" {
				t.Fatal("no Retry-After")
			}
			// The retry with the same key learns the outcome: a replay if
			// it committed, a first execution if it did not.
			retry := a.post("unsure", 100)
			wantStatus(t, retry, http.StatusCreated)
			wantReplayed(t, retry, committed)
			if c, k := a.charges(t), a.keys(t); c != 1 || k != 1 {
				t.Fatalf("%d charges and %d keys, want 1 and 1", c, k)
			}
		})
	}
}
