package idemhttp_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/testdb"
)

// newConfigured is the test app under NewMiddleware with cfg; extra routes
// may be added to mux before the first request.
func newConfigured(t *testing.T, cfg *idemhttp.Config, configure ...func(mux *http.ServeMux, a *app)) *app {
	t.Helper()
	a := &app{pool: testdb.New(t)}
	if _, err := a.pool.Exec(context.Background(), `create table charges (
		id bigserial primary key, amount int not null, owner text not null default '')`); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", a.create)
	mux.HandleFunc("GET /charges", func(w http.ResponseWriter, r *http.Request) {
		var n int
		if err := a.pool.QueryRow(r.Context(), "select count(*) from charges").Scan(&n); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "charges=%d tx=%t", n, idemhttp.Tx(r.Context()) != nil)
	})
	for _, f := range configure {
		f(mux, a)
	}
	mw, err := idemhttp.NewMiddleware(a.pool, shared(cfg))
	if err != nil {
		t.Fatal(err)
	}
	a.handler = mw.Handler(mux)
	return a
}

// A scope function that returns an unusable scope is bad input: 400, and
// the handler does not run. An error from it is 401.
func TestInvalidScopeIsBadInput(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, &idemhttp.Config{Scope: func(r *http.Request) (string, error) {
		if u := r.Header.Get("X-User"); u != "" {
			return u, nil
		}
		return "", errors.New("not signed in")
	}})
	w := a.post("k", 100, "X-User", strings.Repeat("u", 300))
	wantProblem(t, w, http.StatusBadRequest, idemhttp.ProblemInvalidRequest)
	unauthorized := a.post("k", 100)
	wantProblem(t, unauthorized, http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
	if got := unauthorized.Header().Get("WWW-Authenticate"); got != "Bearer" {
		t.Fatalf("401 without a challenge: WWW-Authenticate %q", got)
	}
	if a.runs.Load() != 0 || a.charges(t) != 0 {
		t.Fatal("the handler ran")
	}
	// The same scope set in the context by an authentication middleware in
	// front is honoured, and checked the same way.
	b := newConfigured(t, nil)
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r.WithContext(idem.ContextWithScope(r.Context(), r.Header.Get("X-User"))))
		})
	}
	b.handler = auth(b.handler)
	wantProblem(t, b.post("k", 100, "X-User", "a\x00b"), http.StatusBadRequest, idemhttp.ProblemInvalidRequest)
	wantStatus(t, b.post("k", 100, "X-User", "alice"), http.StatusCreated)
	wantStatus(t, b.post("k", 100, "X-User", "bob"), http.StatusCreated)
	wantReplayed(t, b.post("k", 100, "X-User", "alice"), true)
	if b.charges(t) != 2 {
		t.Fatalf("%d charges, want one per principal", b.charges(t))
	}
}

// A validation failure (400) is not stored: the client fixes the body and
// retries with the same key, and the handler runs. NoStore does the same for
// any status.
func TestValidationFailureIsNotStored(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, nil, func(mux *http.ServeMux, a *app) {
		mux.HandleFunc("POST /declined", func(w http.ResponseWriter, r *http.Request) {
			a.runs.Add(1)
			if r.Header.Get("X-Temporary") != "" {
				idemhttp.NoStore(r.Context())
			}
			w.WriteHeader(http.StatusPaymentRequired)
		})
	})
	wantStatus(t, a.send(http.MethodPost, "/charges", "k", []byte(`{"amount":`)), http.StatusBadRequest)
	w := a.post("k", 100)
	wantStatus(t, w, http.StatusCreated)
	wantReplayed(t, w, false)
	wantReplayed(t, a.post("k", 100), true)
	if a.charges(t) != 1 || a.runs.Load() != 2 {
		t.Fatalf("%d charges, %d runs; want 1 and 2", a.charges(t), a.runs.Load())
	}
	// 402 is stored by default; with NoStore it is not.
	wantStatus(t, a.send(http.MethodPost, "/declined", "d", nil, "X-Temporary", "1"), http.StatusPaymentRequired)
	wantReplayed(t, a.send(http.MethodPost, "/declined", "d", nil), false)
	wantReplayed(t, a.send(http.MethodPost, "/declined", "d", nil), true)
	for status, stored := range map[int]bool{200: true, 302: true, 400: false, 401: false, 402: true, 403: false,
		404: true, 408: false, 409: true, 410: true, 422: false, 429: false, 451: true, 500: false, 503: false} {
		if idemhttp.DefaultStoreStatus(status) != stored {
			t.Errorf("DefaultStoreStatus(%d) = %t, want %t", status, !stored, stored)
		}
	}
}

// JSON bodies are fingerprinted by value; other bodies byte for byte.
func TestJSONFingerprintByValue(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, nil, func(mux *http.ServeMux, a *app) {
		mux.HandleFunc("POST /notes", func(w http.ResponseWriter, r *http.Request) {
			a.runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		})
	})
	send := func(key, contentType, body string) *httptest.ResponseRecorder {
		return a.send(http.MethodPost, "/notes", key, []byte(body), "Content-Type", contentType)
	}
	wantReplayed(t, send("j", "application/json", `{"amount":100,"currency":"USD"}`), false)
	wantReplayed(t, send("j", "application/json; charset=utf-8", `{ "currency": "USD", "amount": 1e2 }`), true)
	wantProblem(t, send("j", "application/json", `{"amount":101,"currency":"USD"}`), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
	// A +json type is JSON too.
	wantReplayed(t, send("m", "application/merge-patch+json", `{"a":1,"b":2}`), false)
	wantReplayed(t, send("m", "application/merge-patch+json", `{"b":2,"a":1.0}`), true)
	// Anything else, and JSON that does not parse, is compared byte for byte.
	wantReplayed(t, send("t", "text/plain", `{"a":1,"b":2}`), false)
	wantProblem(t, send("t", "text/plain", `{"b":2,"a":1}`), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
	wantReplayed(t, send("d", "application/json", `{"amount":100000,"Amount":1}`), false)
	wantProblem(t, send("d", "application/json", `{"Amount":1,"amount":100000}`), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
	// Another path with the same key and body is another request.
	mux2 := a.send(http.MethodPost, "/charges", "j", []byte(`{"amount":100,"currency":"USD"}`), "Content-Type", "application/json")
	wantProblem(t, mux2, http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
}

// A service renders the middleware's answers in its own error format, and
// problem types never name a domain the project does not control.
func TestProblemsInTheServiceFormat(t *testing.T) {
	t.Parallel()
	type envelope struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	a := newConfigured(t, &idemhttp.Config{
		Required:    true,
		ProblemBase: "https://errors.example.com/idem/",
		WriteProblem: func(w http.ResponseWriter, r *http.Request, p idemhttp.Problem) {
			var e envelope
			e.Error.Code, e.Error.Message = p.Type, p.Detail
			w.Header().Set("Content-Type", "application/vnd.example.error+json")
			w.WriteHeader(p.Status)
			_ = json.NewEncoder(w).Encode(e)
		},
	})
	w := a.post("", 100)
	wantStatus(t, w, http.StatusBadRequest)
	var e envelope
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code != "https://errors.example.com/idem/missing-key" {
		t.Fatalf("custom error body %q (%v)", w.Body.String(), err)
	}
	for _, typ := range []string{idemhttp.ProblemMissingKey, idemhttp.ProblemInvalidKey, idemhttp.ProblemKeyMismatch,
		idemhttp.ProblemInProgress, idemhttp.ProblemBodyTooLarge, idemhttp.ProblemOutcomeUnknown, idemhttp.ProblemUnavailable,
		idemhttp.ProblemUnauthorized, idemhttp.ProblemInvalidRequest, idemhttp.ProblemResponseTooLarge, idemhttp.ProblemInternal} {
		if !strings.HasPrefix(typ, "/problems/") {
			t.Errorf("problem type %q is not a relative reference", typ)
		}
	}
}

// A gzip body is replayed with its Content-Encoding, so it can be decoded.
func TestReplayKeepsTheRepresentation(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, nil, func(mux *http.ServeMux, a *app) {
		mux.HandleFunc("POST /report", func(w http.ResponseWriter, r *http.Request) {
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			_, _ = zw.Write([]byte(`{"total":42}`))
			_ = zw.Close()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Language", "en")
			w.Header().Set("Content-Disposition", `attachment; filename="report.json"`)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(buf.Bytes())
		})
	})
	first := a.send(http.MethodPost, "/report", "k", nil)
	replay := a.send(http.MethodPost, "/report", "k", nil)
	wantReplayed(t, replay, true)
	for _, h := range []string{"Content-Type", "Content-Encoding", "Content-Language", "Content-Disposition"} {
		if replay.Header().Get(h) != first.Header().Get(h) || replay.Header().Get(h) == "" {
			t.Errorf("%s: replayed %q, first %q", h, replay.Header().Get(h), first.Header().Get(h))
		}
	}
	zr, err := gzip.NewReader(replay.Body)
	if err != nil {
		t.Fatal(err)
	}
	if body, err := io.ReadAll(zr); err != nil || string(body) != `{"total":42}` {
		t.Fatalf("replayed body decodes to %q, %v", body, err)
	}
}

// capturingHandler is a slog handler that keeps its records.
type capturingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *capturingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *capturingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *capturingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *capturingHandler) WithGroup(string) slog.Handler      { return h }

func (h *capturingHandler) text() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, r := range h.records {
		b.WriteString(r.Level.String() + " " + r.Message)
		r.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.String())
			return true
		})
		b.WriteString("\n")
	}
	return b.String()
}

// Every 5xx of the middleware's own reaches the logger and the error
// callback with its cause; the key never does.
func TestFailuresReachTheOperator(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	logs := &capturingHandler{}
	var (
		mu     sync.Mutex
		causes []error
	)
	broken := &lossyCommit{pool: pool, commit: true}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /x", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	mw, err := idemhttp.NewMiddleware(broken, &idemhttp.Config{SharedKeys: true,
		Logger: slog.New(logs),
		OnError: func(r *http.Request, p idemhttp.Problem, err error) {
			mu.Lock()
			defer mu.Unlock()
			causes = append(causes, err)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(mux)
	for _, key := range []string{"secret-key-1", ""} {
		r := httptest.NewRequest(http.MethodPost, "/x", nil)
		if key != "" {
			r.Header.Set(idemhttp.HeaderKey, key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.ProblemOutcomeUnknown)
	}
	text := logs.text()
	if strings.Count(text, "ERROR") != 2 || !strings.Contains(text, "connection reset") {
		t.Fatalf("log:\n%s\nwant two errors with their cause", text)
	}
	if strings.Contains(text, "secret-key-1") {
		t.Fatal("the key reached the log")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(causes) != 2 || !errors.Is(causes[0], idem.ErrOutcomeUnknown) {
		t.Fatalf("OnError saw %v", causes)
	}
}

// A keyless request whose COMMIT failed in flight is answered "outcome
// unknown", not "did not commit".
func TestKeylessOutcomeUnknown(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /x", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	mw, err := idemhttp.NewMiddleware(&lossyCommit{pool: pool, commit: true}, &idemhttp.Config{SharedKeys: true, OnError: func(*http.Request, idemhttp.Problem, error) {}})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	mw.Handler(mux).ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/x", nil))
	wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.ProblemOutcomeUnknown)
}

// blockingWriter is a client that never reads: Write blocks until release.
type blockingWriter struct {
	header  http.Header
	writing chan struct{}
	release chan struct{}
	status  int
	once    sync.Once
}

func newBlockingWriter() *blockingWriter {
	return &blockingWriter{header: http.Header{}, writing: make(chan struct{}), release: make(chan struct{})}
}

func (b *blockingWriter) Header() http.Header { return b.header }
func (b *blockingWriter) WriteHeader(s int)   { b.status = s }
func (b *blockingWriter) Write(p []byte) (int, error) {
	b.once.Do(func() { close(b.writing) })
	<-b.release
	return len(p), nil
}

// The transaction ends, and its connection returns to the pool, before the
// first byte of the response goes out: a client that never reads holds no
// connection, on any path.
func TestConnectionReleasedBeforeWriting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, key string
		amount    int
	}{
		{"keyless success", "", 100},
		{"keyless refusal", "", -1},
		{"keyless validation failure", "", -9},
		{"keyed success", "k1", 100},
		{"keyed refusal", "k2", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := &app{pool: testdb.New(t, func(c *pgxpool.Config) { c.MaxConns = 1 })}
			if _, err := a.pool.Exec(context.Background(), `create table charges (
				id bigserial primary key, amount int not null, owner text not null default '')`); err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
				if tc.amount == -9 {
					w.WriteHeader(http.StatusBadRequest)
					_, _ = w.Write(bytes.Repeat([]byte("<"), 1<<20))
					return
				}
				a.create(w, r)
			})
			mw, err := idemhttp.NewMiddleware(a.pool, shared(nil))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := json.Marshal(chargeRequest{Amount: tc.amount})
			r := httptest.NewRequest(http.MethodPost, "/charges", bytes.NewReader(body))
			if tc.key != "" {
				r.Header.Set(idemhttp.HeaderKey, tc.key)
			}
			bw := newBlockingWriter()
			served := make(chan struct{})
			go func() {
				defer close(served)
				mw.Handler(mux).ServeHTTP(bw, r)
			}()
			select {
			case <-bw.writing:
			case <-time.After(30 * time.Second):
				t.Fatal("the response was never written")
			}
			// The only connection must be free while the client stalls.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn, err := a.pool.Acquire(ctx)
			close(bw.release)
			<-served
			if err != nil {
				t.Fatalf("the pool's only connection is held while the response is written: %v", err)
			}
			conn.Release()
		})
	}
}

// A response over MaxResponseBytes is neither held nor stored: its writes
// roll back and the client learns why.
func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, &idemhttp.Config{MaxResponseBytes: 1024, OnError: func(*http.Request, idemhttp.Problem, error) {}},
		func(mux *http.ServeMux, a *app) {
			mux.HandleFunc("POST /big", func(w http.ResponseWriter, r *http.Request) {
				a.runs.Add(1)
				if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), "insert into charges (amount) values (1)"); err != nil {
					t.Error(err)
				}
				w.WriteHeader(http.StatusCreated)
				for i := 0; i < 10; i++ {
					_, _ = w.Write(bytes.Repeat([]byte("x"), 512))
				}
			})
		})
	for _, key := range []string{"k", ""} {
		w := a.send(http.MethodPost, "/big", key, nil)
		wantProblem(t, w, http.StatusInternalServerError, idemhttp.ProblemResponseTooLarge)
	}
	if a.charges(t) != 0 || a.keys(t) != 0 {
		t.Fatalf("%d charges and %d keys after responses over the limit", a.charges(t), a.keys(t))
	}
}

// A stored response edited in the table cannot make a replay send headers
// outside the replay list, nor a non-final status.
func TestTamperedStoredResponse(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, &idemhttp.Config{OnError: func(*http.Request, idemhttp.Problem, error) {}})
	wantStatus(t, a.post("k", 100), http.StatusCreated)
	ctx := context.Background()
	// Rewrite the stored response: a Set-Cookie header, then a 1xx status.
	forged := storedResponse(201, map[string]string{"Set-Cookie": "session=attacker", "Content-Type": "application/json"}, `{"forged":true}`)
	if _, err := a.pool.Exec(ctx, "update idempotency_keys set response = $1", forged); err != nil {
		t.Fatal(err)
	}
	w := a.post("k", 100)
	wantReplayed(t, w, true)
	if w.Header().Get("Set-Cookie") != "" {
		t.Fatal("a forged Set-Cookie was replayed")
	}
	if _, err := a.pool.Exec(ctx, "update idempotency_keys set response = $1", storedResponse(101, nil, "")); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, a.post("k", 100), http.StatusInternalServerError, idemhttp.ProblemInternal)
}

// storedResponse encodes a response as the middleware stores it (version 1:
// status, header fields, body).
func storedResponse(status int, header map[string]string, body string) []byte {
	b := []byte{1}
	b = appendUvarint(b, uint64(status))
	b = appendUvarint(b, uint64(len(header)))
	for k, v := range header {
		b = appendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = appendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return append(b, body...)
}

func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// Keyless requests honour Config.TxOptions, and NewMiddleware refuses a bad
// configuration with an error instead of a panic.
func TestConfigChecked(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	for name, cfg := range map[string]*idemhttp.Config{
		"negative body limit":       {MaxBodyBytes: -1},
		"negative response limit":   {MaxResponseBytes: -1},
		"negative wait":             {Wait: -time.Second},
		"fingerprint and headers":   {Fingerprint: idemhttp.DefaultFingerprint, FingerprintHeaders: []string{"X"}},
		"read-only transactions":    {TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}},
		"a method with white space": {Methods: []string{"PO ST"}},
	} {
		if _, err := idemhttp.NewMiddleware(pool, shared(cfg)); !errors.Is(err, idem.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := idemhttp.NewMiddleware(nil, nil); !errors.Is(err, idem.ErrInvalidOption) {
		t.Errorf("nil database: %v", err)
	}
	var iso string
	mux := http.NewServeMux()
	mux.HandleFunc("POST /iso", func(w http.ResponseWriter, r *http.Request) {
		_ = idemhttp.Tx(r.Context()).QueryRow(r.Context(), "show transaction_isolation").Scan(&iso)
	})
	mw, err := idemhttp.NewMiddleware(pool, &idemhttp.Config{SharedKeys: true, TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"", "k"} {
		iso = ""
		r := httptest.NewRequest(http.MethodPost, "/iso", nil)
		if key != "" {
			r.Header.Set(idemhttp.HeaderKey, key)
		}
		mw.Handler(mux).ServeHTTP(httptest.NewRecorder(), r)
		if iso != "serializable" {
			t.Errorf("key %q: isolation %q, want serializable", key, iso)
		}
	}
}
