package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/faultproxy"
	"github.com/idemhq/idem/testkit/testdb"
)

// logKey is the key of every request in the logging tests: distinctive, so
// that a test can search everything logged for it.
const logKey = "key-2f9d41c7-do-not-log"

// logBook captures what the middleware logs (as JSON lines) and what it
// hands to OnError.
type logBook struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	reported []idemhttp.Problem
	causes   []error
}

func (b *logBook) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBook) config() *idemhttp.Config {
	return &idemhttp.Config{
		Logger: slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnError: func(_ *http.Request, p idemhttp.Problem, err error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.reported = append(b.reported, p)
			b.causes = append(b.causes, err)
		},
	}
}

// records returns the log records, parsed.
func (b *logBook) records(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b.buf.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

// wantLogged checks that exactly one record and one OnError call reported
// the answer of status and type typ, with a cause, and that nothing logged
// or reported holds the key.
func (b *logBook) wantLogged(t *testing.T, status int, typ string) {
	t.Helper()
	recs := b.records(t)
	if len(recs) != 1 {
		t.Fatalf("%d log records, want 1: %v", len(recs), recs)
	}
	rec := recs[0]
	if rec["level"] != "ERROR" || rec["status"] != float64(status) || rec["type"] != typ || rec["err"] == nil || rec["err"] == "" {
		t.Fatalf("log record %v, want level ERROR, status %d, type %s and the cause", rec, status, typ)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.reported) != 1 || b.reported[0].Status != status || b.reported[0].Type != typ || b.causes[0] == nil {
		t.Fatalf("OnError got %v (causes %v), want one %d %s with its cause", b.reported, b.causes, status, typ)
	}
	if strings.Contains(b.buf.String(), logKey) || strings.Contains(b.causes[0].Error(), logKey) {
		t.Fatalf("the key reached the log: %s / %v", b.buf.String(), b.causes[0])
	}
}

func logRequest(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
	if key != "" {
		r.Header.Set(idemhttp.HeaderKey, key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func logMiddleware(t *testing.T, db idem.Beginner, cfg *idemhttp.Config, next http.HandlerFunc) http.Handler {
	t.Helper()
	mw, err := idemhttp.NewMiddleware(db, shared(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return mw.Handler(next)
}

func created(w http.ResponseWriter, r *http.Request) {
	if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), "select 1"); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// TestServerErrorsAreLogged checks that every 5xx answer of the
// middleware's own reaches the logger and OnError with its cause, and that
// none of them carries the key.
func TestServerErrorsAreLogged(t *testing.T) {
	t.Parallel()

	t.Run("outcome unknown", func(t *testing.T) {
		t.Parallel()
		pool, proxy := proxiedPool(t)
		// COMMIT is carried out; its answer never comes back.
		proxy.SetRule(faultproxy.Once(faultproxy.ServerTag("COMMIT"), faultproxy.CutBefore))
		var b logBook
		w := logRequest(logMiddleware(t, pool, b.config(), created), logKey)
		wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.ProblemOutcomeUnknown)
		b.wantLogged(t, http.StatusServiceUnavailable, idemhttp.ProblemOutcomeUnknown)
		if !errors.Is(b.causes[0], idem.ErrOutcomeUnknown) {
			t.Fatalf("cause %v, want ErrOutcomeUnknown", b.causes[0])
		}
	})

	for _, key := range []string{logKey, ""} {
		t.Run("database down/key="+map[bool]string{true: "yes", false: "no"}[key != ""], func(t *testing.T) {
			t.Parallel()
			var b logBook
			w := logRequest(logMiddleware(t, unreachablePool(t), b.config(), created), key)
			wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.ProblemUnavailable)
			b.wantLogged(t, http.StatusServiceUnavailable, idemhttp.ProblemUnavailable)
		})
	}

	t.Run("internal", func(t *testing.T) {
		t.Parallel()
		// The handler writes its own key's row, which the call then cannot
		// write: nothing can be stored, and a retry would fail the same way
		// (idem.ErrKeyLost).
		var b logBook
		h := logMiddleware(t, testdb.New(t), b.config(), func(w http.ResponseWriter, r *http.Request) {
			k, _ := idem.KeyFromContext(r.Context())
			if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), `insert into idempotency_keys
				(scope, idempotency_key, request_hash, status, response, completed_at, expires_at)
				values ($1, $2, 'h', 'completed', '\x31', now(), now() + interval '1 day')`, k.Scope, k.Key); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
		w := logRequest(h, logKey)
		wantProblem(t, w, http.StatusInternalServerError, idemhttp.ProblemInternal)
		b.wantLogged(t, http.StatusInternalServerError, idemhttp.ProblemInternal)
		if !errors.Is(b.causes[0], idem.ErrKeyLost) {
			t.Fatalf("cause %v, want ErrKeyLost", b.causes[0])
		}
	})

	for _, key := range []string{logKey, ""} {
		t.Run("response too large/key="+map[bool]string{true: "yes", false: "no"}[key != ""], func(t *testing.T) {
			t.Parallel()
			var b logBook
			cfg := b.config()
			cfg.MaxResponseBytes = 8
			h := logMiddleware(t, testdb.New(t), cfg, func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write([]byte("more than eight bytes"))
			})
			w := logRequest(h, key)
			wantProblem(t, w, http.StatusInternalServerError, idemhttp.ProblemResponseTooLarge)
			b.wantLogged(t, http.StatusInternalServerError, idemhttp.ProblemResponseTooLarge)
		})
	}

	t.Run("client errors are not logged", func(t *testing.T) {
		t.Parallel()
		var b logBook
		held, release := make(chan struct{}), make(chan struct{})
		h := logMiddleware(t, testdb.New(t), b.config(), func(w http.ResponseWriter, r *http.Request) {
			close(held)
			<-release
			w.WriteHeader(http.StatusCreated)
		})
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- logRequest(h, logKey) }()
		<-held
		wantProblem(t, logRequest(h, logKey), http.StatusConflict, idemhttp.ProblemInProgress)
		close(release)
		wantStatus(t, <-done, http.StatusCreated)
		if recs := b.records(t); len(recs) != 0 || len(b.reported) != 0 {
			t.Fatalf("a 409 and a 201 were logged: %v %v", recs, b.reported)
		}
	})
}
