package payments

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/testdb"
)

// TestKeyMiddlewareFailsClosed is the review's finding for the example:
// POST /payments's idemhttp middleware took its scope from the context
// only, so a keyed request that reached it without an account (a route
// wired without requireAccount) ran the handler in the one namespace all
// clients share, where another client's key would replay this one's
// answer. The middleware's Scope now comes from the authenticated account
// and fails without one: 401, the handler does not run, no key is stored.
// With an account, the key is stored under that account's scope.
func TestKeyMiddlewareFailsClosed(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	if err := Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := newKeyMiddleware(keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(r *http.Request) *httptest.ResponseRecorder {
		r.Header.Set(idemhttp.HeaderKey, "no-scope-1")
		r.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}

	rec := send(httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/payments", strings.NewReader(`{}`)))
	if rec.Code != http.StatusUnauthorized || ran.Load() != 0 || !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("a keyed request without an account: %d (WWW-Authenticate %q), handler ran %d times; want 401 and no run",
			rec.Code, rec.Header().Get("WWW-Authenticate"), ran.Load())
	}
	var n int
	if err := pool.QueryRow(t.Context(), "select count(*) from idempotency_keys").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d keys stored without an account (%v)", n, err)
	}

	account := uuid.New()
	ctx := context.WithValue(t.Context(), accountKey{}, account) // as requireAccount does
	rec = send(httptest.NewRequestWithContext(ctx, http.MethodPost, "/payments", strings.NewReader(`{}`)))
	if rec.Code != http.StatusCreated || ran.Load() != 1 {
		t.Fatalf("with an account: %d, handler ran %d times", rec.Code, ran.Load())
	}
	var scope string
	if err := pool.QueryRow(t.Context(), "select scope from idempotency_keys").Scan(&scope); err != nil || scope != scopeOf(account) {
		t.Fatalf("stored under scope %q (%v), want %q", scope, err, scopeOf(account))
	}
}
