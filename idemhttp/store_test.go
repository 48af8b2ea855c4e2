package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/idemhq/idem/idemhttp"
)

// contentionBound bounds a request that meets a key held by another
// request: it is answered 409 at once. A middleware that waited for the
// holder instead would hang the test; with the bound, the request's
// context ends and the test fails within seconds, saying why.
const contentionBound = 10 * time.Second

// postBounded is post with a context: the request's, which the middleware
// honours until the handler starts.
func (a *app) postBounded(ctx context.Context, key string, amount int) *httptest.ResponseRecorder {
	body, _ := json.Marshal(chargeRequest{Amount: amount})
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", bytes.NewReader(body))
	r.Header.Set(idemhttp.HeaderKey, key)
	w := httptest.NewRecorder()
	a.handler.ServeHTTP(w, r)
	return w
}

// postContended is post for a request whose key another request holds.
func (a *app) postContended(t *testing.T, key string, amount int) *httptest.ResponseRecorder {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), contentionBound)
	defer cancel()
	w := a.postBounded(ctx, key, amount)
	if ctx.Err() != nil {
		t.Fatalf("a request whose key was held was not answered within %v (status %d): it waited for the holder instead of answering 409 at once", contentionBound, w.Code)
	}
	return w
}

// Every 5xx leaves the key free, however far the handler got: its writes
// roll back, nothing is stored, and a retry with the same key runs the
// handler again, even with another body (a stored key would answer 422).
// TestServerErrorNotStored shows it for 500 with the same body.
func TestServerErrorsLeaveTheKeyFree(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, &idemhttp.Config{}, func(mux *http.ServeMux, a *app) {
		mux.HandleFunc("POST /upstream", func(w http.ResponseWriter, r *http.Request) {
			a.runs.Add(1)
			var req struct{ Status int }
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				http.Error(w, "bad body", http.StatusBadRequest)
				return
			}
			if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), "insert into charges (amount) values ($1)", req.Status); err != nil {
				t.Error(err)
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/upstream/1")
			w.WriteHeader(req.Status)
			_, _ = w.Write([]byte(`{"status":` + strconv.Itoa(req.Status) + `}`))
		})
	})
	send := func(key string, status int) *httptest.ResponseRecorder {
		return a.send(http.MethodPost, "/upstream", key, []byte(`{"status":`+strconv.Itoa(status)+`}`), "Content-Type", "application/json")
	}
	for _, status := range []int{500, 502, 503, 504, 599} {
		key := "k-" + strconv.Itoa(status)
		runs := a.runs.Load()
		w := send(key, status)
		wantStatus(t, w, status)
		wantReplayed(t, w, false)
		if got := w.Body.String(); got != `{"status":`+strconv.Itoa(status)+`}` {
			t.Fatalf("%d: the client got %q, not the handler's body", status, got)
		}
		if c, k := a.charges(t), a.keys(t); c != 0 || k != 0 {
			t.Fatalf("after a %d: %d charges and %d keys, want none", status, c, k)
		}
		// Another body with the same key: the key is free, so it runs.
		retry := send(key, http.StatusCreated)
		wantStatus(t, retry, http.StatusCreated)
		wantReplayed(t, retry, false)
		wantReplayed(t, send(key, http.StatusCreated), true)
		if n := a.runs.Load() - runs; n != 2 {
			t.Fatalf("%d: the handler ran %d times for the key, want 2 (the 5xx and the retry)", status, n)
		}
		if _, err := a.pool.Exec(context.Background(), "delete from charges"); err != nil {
			t.Fatal(err)
		}
		if _, err := a.pool.Exec(context.Background(), "delete from idempotency_keys"); err != nil {
			t.Fatal(err)
		}
	}
	for status := 500; status <= 599; status++ {
		if idemhttp.DefaultStoreStatus(status) {
			t.Errorf("DefaultStoreStatus(%d) = true; no 5xx is stored", status)
		}
	}
}

// The fingerprint covers the method, and tells a JSON body from the same
// bytes sent as another type: each is another request under the same key.
func TestFingerprintParts(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, &idemhttp.Config{Methods: []string{http.MethodPost, http.MethodPatch}}, func(mux *http.ServeMux, a *app) {
		mux.HandleFunc("/notes", func(w http.ResponseWriter, r *http.Request) {
			a.runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		})
	})
	body := []byte(`{"a":1}`)
	wantReplayed(t, a.send(http.MethodPost, "/notes", "m", body, "Content-Type", "application/json"), false)
	wantProblem(t, a.send(http.MethodPatch, "/notes", "m", body, "Content-Type", "application/json"), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
	wantReplayed(t, a.send(http.MethodPost, "/notes", "m", body, "Content-Type", "application/json"), true)

	wantReplayed(t, a.send(http.MethodPost, "/notes", "f", body, "Content-Type", "text/plain"), false)
	wantProblem(t, a.send(http.MethodPost, "/notes", "f", body, "Content-Type", "application/json"), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
	if n := a.runs.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
	h1, err1 := idemhttp.DefaultFingerprint(httptest.NewRequest(http.MethodPost, "/notes", nil), body)
	h2, err2 := idemhttp.DefaultFingerprint(httptest.NewRequest(http.MethodPatch, "/notes", nil), body)
	if err := errors.Join(err1, err2); err != nil || h1 == h2 {
		t.Fatalf("POST and PATCH fingerprint alike: %s, %s (%v)", h1, h2, err)
	}
}

// Only the headers on the replay list are stored: a cookie or a request id
// reaches the client on the first response and is never kept at rest.
func TestOnlyReplayHeadersAreStored(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, &idemhttp.Config{ReplayHeaders: []string{"X-Charge-Amount"}}, func(mux *http.ServeMux, a *app) {
		mux.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Set-Cookie", "session=s3cr3t-cookie")
			w.Header().Set("X-Request-Id", "req-s3cr3t")
			w.Header().Set("X-Charge-Amount", "100")
			w.Header().Set("Location", "/sessions/1")
			w.WriteHeader(http.StatusCreated)
		})
	})
	first := a.send(http.MethodPost, "/login", "k", nil)
	if first.Header().Get("Set-Cookie") == "" || first.Header().Get("X-Request-Id") == "" {
		t.Fatal("the first response lost the handler's headers")
	}
	if n := a.count(t, "select count(*) from idempotency_keys where position('s3cr3t' in encode(response, 'escape')) > 0"); n != 0 {
		t.Fatal("a header outside the replay list was stored")
	}
	if n := a.count(t, "select count(*) from idempotency_keys where position('/sessions/1' in encode(response, 'escape')) > 0 and position('X-Charge-Amount' in encode(response, 'escape')) > 0"); n != 1 {
		t.Fatal("the replay headers were not stored")
	}
	replay := a.send(http.MethodPost, "/login", "k", nil)
	wantReplayed(t, replay, true)
	if replay.Header().Get("Location") != "/sessions/1" || replay.Header().Get("X-Charge-Amount") != "100" || replay.Header().Get("Set-Cookie") != "" {
		t.Fatalf("replayed headers %v", replay.Header())
	}
}
