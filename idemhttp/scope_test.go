package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// authenticate is the authentication middleware in front of idemhttp in
// these tests: X-User names the principal, whom it puts in the context as
// the scope; without X-User the request goes on unauthenticated.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user := r.Header.Get("X-User"); user != "" {
			r = r.WithContext(idem.ContextWithScope(r.Context(), "user:"+user))
		}
		next.ServeHTTP(w, r)
	})
}

// Keys are scoped by the principal in the context (ContextScope): a second
// principal who sends the first one's key and request gets an execution of
// her own, never the first one's stored response; a request whose context
// carries no principal is refused, and its handler does not run.
func TestContextScopeFailsClosed(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, &idemhttp.Config{Scope: idemhttp.ContextScope})
	a.handler = authenticate(a.handler)

	alice := a.post("their-key", 100, "X-User", "alice")
	bob := a.post("their-key", 100, "X-User", "bob")
	wantStatus(t, alice, http.StatusCreated)
	wantStatus(t, bob, http.StatusCreated)
	wantReplayed(t, bob, false)
	if owner(t, alice) != "alice" || owner(t, bob) != "bob" {
		t.Fatalf("owners %q and %q, want alice and bob", owner(t, alice), owner(t, bob))
	}
	again := a.post("their-key", 100, "X-User", "bob")
	wantReplayed(t, again, true)
	if owner(t, again) != "bob" {
		t.Fatalf("bob's replay returned %s's response", owner(t, again))
	}

	runs := a.runs.Load()
	wantProblem(t, a.post("their-key", 100), http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
	if a.runs.Load() != runs {
		t.Fatal("the handler ran for a keyed request without a principal")
	}
	if c, k := a.charges(t), a.keys(t); c != 2 || k != 2 {
		t.Fatalf("%d charges and %d keys, want 2 and 2", c, k)
	}
}

// A Scope function that returns an empty scope names no principal: the
// request is refused rather than put in the key space every such request
// would share.
func TestEmptyScopeIsRefused(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, &idemhttp.Config{Scope: func(r *http.Request) (string, error) {
		return r.Header.Get("X-User"), nil // "" for an anonymous request
	}})
	wantProblem(t, a.post("k", 100), http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
	wantProblem(t, a.post("k", 100), http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
	if runs, k := a.runs.Load(), a.keys(t); runs != 0 || k != 0 {
		t.Fatalf("%d runs and %d keys for anonymous requests, want none", runs, k)
	}
	wantStatus(t, a.post("k", 100, "X-User", "carol"), http.StatusCreated)
}

// With SharedKeys, the opt-in, keys live in one key space: a second client
// that sends the first one's key and request receives its stored response.
func TestSharedKeysShareResponses(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, &idemhttp.Config{SharedKeys: true})
	wantStatus(t, a.post("k", 100, "X-User", "alice"), http.StatusCreated)
	w := a.post("k", 100, "X-User", "bob")
	wantReplayed(t, w, true)
	if owner(t, w) != "alice" {
		t.Fatalf("owner %q, want alice's stored response", owner(t, w))
	}
}

func owner(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var c charge
	if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	return c.Owner
}
