package idemhttp_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// COMMIT's own reply decides what the client is told, on both paths. With
// a key, a COMMIT that was never answered (the connection cut, or a FATAL
// in its place) is 503 outcome-unknown, never a plain failure, and a retry
// with the key learns the outcome; a COMMIT confirmed before the
// connection failed is the handler's success. Without a key, the plain
// transaction's commit cannot tell a confirmed COMMIT from the FATAL after
// it (pgx.Tx.Commit does not say), so every failed commit is
// outcome-unknown: never "did not commit".
func TestCommitOutcome(t *testing.T) {
	t.Parallel()
	for _, f := range []struct {
		name      string
		action    faultproxy.Action
		confirmed bool // COMMIT's reply reached the client
	}{
		{"answer lost", faultproxy.CutBefore, false},
		{"FATAL instead of the answer", faultproxy.FatalBefore, false},
		{"confirmed, then FATAL", faultproxy.FatalAfter, true},
		{"confirmed, then reset", faultproxy.CutAfter, true},
	} {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			pool, proxy := proxiedPool(t)
			a := &app{pool: pool}
			if _, err := pool.Exec(context.Background(), `create table charges (
				id bigserial primary key, amount int not null, owner text not null default '')`); err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.HandleFunc("POST /charges", a.create)
			a.handler = handle(t, pool, &idemhttp.Config{Logger: discardLogger()}, mux)

			// COMMIT's CommandComplete is the message the fault strikes.
			proxy.SetRule(faultproxy.Once(faultproxy.ServerTag("COMMIT"), f.action))
			keyed := a.post("k", 100)
			if f.confirmed {
				wantStatus(t, keyed, http.StatusCreated)
			} else {
				wantProblem(t, keyed, http.StatusServiceUnavailable, idemhttp.ProblemOutcomeUnknown)
			}
			proxy.SetRule(faultproxy.Once(faultproxy.ServerTag("COMMIT"), f.action))
			wantProblem(t, a.post("", 100), http.StatusServiceUnavailable, idemhttp.ProblemOutcomeUnknown)

			retry := a.post("k", 100)
			wantStatus(t, retry, http.StatusCreated)
			wantReplayed(t, retry, true)
			if c, runs := a.charges(t), a.runs.Load(); c != 2 || runs != 2 {
				t.Fatalf("%d charges, %d runs; want 2 and 2 (both COMMITs were carried out)", c, runs)
			}
		})
	}
}
