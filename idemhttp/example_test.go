package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemhq/idem/idemhttp"
)

// A client retries a charge with the same Idempotency-Key: the handler runs
// once, and the retry receives the stored response.
func Example() {
	pool, drop := exampleDB() // a *pgxpool.Pool on a migrated database
	defer drop()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "create table charges (id bigserial primary key, amount int not null)"); err != nil {
		panic(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		// The insert, the key and the response commit together.
		tx := idemhttp.Tx(r.Context())
		var id int64
		err := tx.QueryRow(r.Context(), "insert into charges (amount) values (500) returning id").Scan(&id)
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable) // 5xx: not stored, key free
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"amount":500}`, id)
	})
	srv := httptest.NewServer(idemhttp.New(pool, idemhttp.WithRequired(true))(mux))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Location"),
			resp.Header.Get("Idempotent-Replayed"), body)
	}

	var n int
	if err := pool.QueryRow(ctx, "select count(*) from charges").Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// 201 /charges/1 replayed="" {"id":1,"amount":500}
	// 201 /charges/1 replayed="true" {"id":1,"amount":500}
	// charges: 1
}
