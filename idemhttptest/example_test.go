package idemhttptest_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/idemhttptest"
)

// A service's POST /charges is proved exactly-once. In a test, the last
// lines are suite.Run(t): each scenario becomes a subtest. Outside a test,
// as here, Results runs the same scenarios and says how each went.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // a database with idem's schema
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `create table example_charges (id bigserial primary key, amount int not null)`); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `drop table example_charges`)

	// The service: the handler inserts the charge through the request's
	// transaction, behind idemhttp's middleware.
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		var id int64
		err := idemhttp.Tx(r.Context()).QueryRow(r.Context(),
			"insert into example_charges (amount) values (500) returning id").Scan(&id)
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"amount":500}`, id)
	})
	mw, err := idemhttp.NewMiddleware(pool, &idemhttp.Config{
		Required: true,
		Scope:    idemhttp.ContextScope, // the account authenticate put in the context
	})
	if err != nil {
		log.Fatal(err)
	}
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer token-ada" { // a real service verifies a credential here
				http.Error(w, "sign in", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r.WithContext(idem.ContextWithScope(r.Context(), "account:ada")))
		})
	}
	var faults idemhttptest.Faults // only in tests: lets the kit fail a request after the handler ran
	handler := authenticate(mw.Handler(faults.Middleware(mux)))

	suite := idemhttptest.Suite{
		Handler: handler,
		DB:      pool,
		Faults:  &faults,
		Request: func(t testing.TB) *http.Request {
			r, err := http.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
			if err != nil {
				t.Fatal(err)
			}
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer token-ada")
			return r
		},
		Effects: func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, "select count(*) from example_charges").Scan(&n)
			return n, err
		},
		Check: func(t testing.TB, s idemhttptest.Scenario) {
			var total int
			if err := pool.QueryRow(t.Context(), "select coalesce(sum(amount), 0) from example_charges").Scan(&total); err != nil {
				t.Fatal(err)
			}
			if want := 500 * s.TotalExecutions; total != want {
				t.Errorf("charged %d in all, want %d", total, want)
			}
		},
	}
	results, err := suite.Results(ctx) // in a test: suite.Run(t)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range results {
		fmt.Println(r.Scenario, r.Passed(), r.Failures)
	}
	// Output:
	// Retries true []
	// LostAnswer true []
	// Concurrent true []
	// ChangedRequest true []
	// FailureNotStored true []
	// WritesInTransaction true []
}
