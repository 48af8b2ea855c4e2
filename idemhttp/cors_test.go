package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/idemhq/idem/idemhttp"
)

// corsOrigin is the browser application's origin in TestCORS.
const corsOrigin = "https://app.example"

// cors is a minimal CORS layer, as a service puts in front of the
// middleware: it answers preflights itself and marks every answer to
// corsOrigin, the middleware's own problems included.
func cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Origin") != corsOrigin {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", corsOrigin)
		h.Add("Vary", "Origin")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "POST")
			h.Set("Access-Control-Allow-Headers", "Content-Type, "+idemhttp.HeaderKey)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Set("Access-Control-Expose-Headers", idemhttp.HeaderReplayed+", Retry-After, Location")
		next.ServeHTTP(w, r)
	})
}

// TestCORS: a browser's cross-origin POST with an Idempotency-Key, through
// a CORS layer in front of the middleware. The key is not a safelisted
// request header, so the browser sends a preflight first: it is answered
// without a key, and stores nothing. The answers the script then reads
// expose Idempotent-Replayed, Retry-After and Location, and the
// middleware's own problem (409) carries the CORS headers too, without
// which the browser would hide it from the script.
func TestCORS(t *testing.T) {
	t.Parallel()
	a := newApp(t, &idemhttp.Config{Required: true})
	a.handler = cors(a.handler)

	// What a browser sends before a POST with Idempotency-Key and a JSON
	// body (Fetch standard: both headers need the server's consent).
	preflight := httptest.NewRequest(http.MethodOptions, "/charges", nil)
	preflight.Header.Set("Origin", corsOrigin)
	preflight.Header.Set("Access-Control-Request-Method", http.MethodPost)
	preflight.Header.Set("Access-Control-Request-Headers", "content-type,idempotency-key")
	w := httptest.NewRecorder()
	a.handler.ServeHTTP(w, preflight)
	if w.Code != http.StatusNoContent {
		t.Fatalf("preflight: %d %s; want 204", w.Code, w.Body)
	}
	for _, asked := range strings.Split(preflight.Header.Get("Access-Control-Request-Headers"), ",") {
		if !allows(w.Header().Get("Access-Control-Allow-Headers"), asked) {
			t.Errorf("preflight: Access-Control-Allow-Headers %q does not allow %s", w.Header().Get("Access-Control-Allow-Headers"), asked)
		}
	}
	if a.keys(t) != 0 || a.runs.Load() != 0 {
		t.Fatalf("the preflight stored %d keys and ran the handler %d times", a.keys(t), a.runs.Load())
	}

	browser := []string{"Origin", corsOrigin, "Content-Type", "application/json"}
	first := a.post("k-cors", 500, browser...)
	wantStatus(t, first, http.StatusCreated)
	replay := a.post("k-cors", 500, browser...)
	wantStatus(t, replay, http.StatusCreated)
	wantReplayed(t, replay, true)
	readable(t, "replay", replay, idemhttp.HeaderReplayed, "Location")

	a.gate, a.entered = make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); a.post("k-held", 700, browser...) }()
	<-a.entered
	busy := a.post("k-held", 700, browser...)
	close(a.gate)
	<-done
	wantProblem(t, busy, http.StatusConflict, idemhttp.ProblemInProgress)
	readable(t, "409", busy, "Retry-After")
}

// readable fails unless a script at corsOrigin may read the answer w and
// each header of names, which w carries.
func readable(t *testing.T, name string, w *httptest.ResponseRecorder, names ...string) {
	t.Helper()
	h := w.Header()
	if h.Get("Access-Control-Allow-Origin") != corsOrigin {
		t.Errorf("%s: Access-Control-Allow-Origin %q: the browser hides the answer", name, h.Get("Access-Control-Allow-Origin"))
	}
	for _, n := range names {
		if h.Get(n) == "" || !allows(h.Get("Access-Control-Expose-Headers"), n) {
			t.Errorf("%s: %s %q, exposed in %q: the script cannot read it", name, n, h.Get(n), h.Get("Access-Control-Expose-Headers"))
		}
	}
}

// allows reports whether the comma-separated header list holds name
// (header names are case-insensitive).
func allows(list, name string) bool {
	return slices.ContainsFunc(strings.Split(list, ","), func(s string) bool {
		return strings.EqualFold(strings.TrimSpace(s), strings.TrimSpace(name))
	})
}
