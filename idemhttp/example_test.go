package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/schema"
)

// A client retries a charge with the same Idempotency-Key: the handler runs
// once, and the retry receives the stored response. Keys are scoped by the
// signed-in user, whom an authentication middleware in front puts in the
// request's context.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := schema.Apply(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "create table if not exists example_charges (id bigserial primary key, amount int not null)"); err != nil {
		log.Fatal(err)
	}

	keys, err := idem.NewClient(pool, nil) // the deployment's idem.Config
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(keys, &idemhttp.Config{Required: true})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		// The insert, the key and the response commit together.
		tx := idemhttp.Tx(r.Context())
		var id int64
		err := tx.QueryRow(r.Context(), "insert into example_charges (amount) values (500) returning id").Scan(&id)
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable) // 5xx: not stored, key free
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"amount":500}`, id)
	})
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			user := r.Header.Get("X-User") // a real service verifies a credential here
			next.ServeHTTP(w, r.WithContext(idem.ContextWithScope(r.Context(), user)))
		})
	}
	srv := httptest.NewServer(authenticate(mw.Handler(mux)))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		req.Header.Set("X-User", "ada")
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Location"),
			resp.Header.Get("Idempotent-Replayed"), body)
	}

	var n int
	if err := pool.QueryRow(ctx, "select count(*) from example_charges").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// 201 /charges/1 replayed="" {"id":1,"amount":500}
	// 201 /charges/1 replayed="true" {"id":1,"amount":500}
	// charges: 1
}
