package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/testdb"
)

// migrated returns a fresh database with the key table, its URL and a pool.
func migrated(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := testdb.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if code, out, errOut := idemCmd(context.Background(), url, "migrate"); code != exitOK {
		t.Fatalf("migrate: %d %s %s", code, out, errOut)
	}
	return url, pool
}

// holdKey runs a call with key through db until release is called, which
// waits for the call to commit.
func holdKey(t *testing.T, db idem.Beginner, key string) (release func()) {
	t.Helper()
	entered, done := make(chan struct{}), make(chan error, 1)
	hold := make(chan struct{})
	go func() {
		_, err := idem.Do(context.Background(), db, key, "h", func(pgx.Tx) (int, error) { close(entered); <-hold; return 1, nil })
		done <- err
	}()
	<-entered
	return func() {
		close(hold)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestForget: forget deletes a key, so the next call runs again; a key
// that holds nothing exits 3, one in progress is left alone (exit 1), and
// without DATABASE_URL forget refuses rather than use the default.
func TestForget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := migrated(t)
	charge := idem.Wrap(pool, "charge", func(_ context.Context, _ pgx.Tx, amount int) (int, error) { return amount, nil })
	sctx := idem.ContextWithScope(ctx, "tenant-7")
	if _, _, err := charge(sctx, "k-refund", 500); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idemCmd(ctx, url, "forget", "-operation", "charge", "-scope", "tenant-7", "k-refund")
	if code != exitOK || !strings.Contains(out, `forgot key "k-refund"`) {
		t.Fatalf("forget: exit %d\n%s%s", code, out, errOut)
	}
	if _, outcome, err := charge(sctx, "k-refund", 500); err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("the call after forget: %v %v; want it run again", outcome, err)
	}
	if code, _, errOut := idemCmd(ctx, url, "forget", "k-refund"); code != exitNotFound || !strings.Contains(errOut, `no key "k-refund" in scope ""`) || !strings.Contains(errOut, "-operation") {
		t.Fatalf("forget in the wrong scope: exit %d, %s; want 3 and the scopes hint", code, errOut)
	}

	release := holdKey(t, pool, "k-busy")
	code, _, errOut = idemCmd(ctx, url, "forget", "k-busy")
	release()
	if code != exitFailure || !strings.Contains(errOut, "in progress") {
		t.Fatalf("forget a key in progress: exit %d, %s", code, errOut)
	}
	if _, outcome, err := idem.Run(ctx, pool, "k-busy", "h", func(context.Context, pgx.Tx) (int, error) { return 2, nil }); err != nil || outcome != idem.OutcomeReplayed {
		t.Fatalf("the key forget left alone: %v %v; want it replayed", outcome, err)
	}

	if code, _, errOut := idemCmd(ctx, "", "forget", "k-busy"); code != exitUsage || !strings.Contains(errOut, "DATABASE_URL is not set") {
		t.Fatalf("forget without DATABASE_URL: exit %d, %s; want a refusal", code, errOut)
	}
}

// TestDefaultDatabaseNamed: without DATABASE_URL, a command says on stderr
// which database it uses. (The bad table name stops it before it connects.)
func TestDefaultDatabaseNamed(t *testing.T) {
	t.Parallel()
	code, _, errOut := idemCmd(context.Background(), "", "stats", "-table", "Bad Name")
	if code != exitUsage || !strings.Contains(errOut, "DATABASE_URL is not set; using "+DefaultURL) {
		t.Fatalf("exit %d, stderr %q; want the default database named", code, errOut)
	}
}

// TestInspectHTTPResponse: a key stored by idemhttp is shown as the HTTP
// response it replays, not as its binary envelope.
func TestInspectHTTPResponse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := migrated(t)
	mw, err := idemhttp.NewMiddleware(pool, &idemhttp.Config{SharedKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/charges/1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1}`))
	}))
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
	r.Header.Set(idemhttp.HeaderKey, "k-http")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		t.Fatalf("POST: %d %s", w.Code, w.Body)
	}
	code, out, errOut := idemCmd(ctx, url, "inspect", "k-http")
	for _, want := range []string{
		"response:     201 Created (stored by idemhttp)",
		"header:       Content-Type: application/json",
		"header:       Location: /charges/1",
		`body:         {"id":1}`,
	} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("inspect: exit %d, want %q in:\n%s%s", code, want, out, errOut)
		}
	}
}

// TestStatsUnfinished: stats reports the operations left unfinished.
func TestStatsUnfinished(t *testing.T) {
	t.Parallel()
	url, _ := migrated(t)
	code, out, errOut := idemCmd(context.Background(), url, "stats")
	if code != exitOK || !strings.Contains(out, "unfinished ops:     0\n") {
		t.Fatalf("stats: exit %d\n%s%s", code, out, errOut)
	}
}
