package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/idemhttp"
)

// A service with idem's middleware, whose first answer is lost: its
// connection is closed after the charge committed. The client retries with
// the same key and receives the stored answer; the charge is made once.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // a database with idem's schema
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "create table example_charges (id bigserial primary key, amount text not null)"); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, "drop table example_charges")

	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(keys, &idemhttp.Config{Required: true, SharedKeys: true})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var id int64
		err := idemhttp.Tx(r.Context()).QueryRow(r.Context(),
			"insert into example_charges (amount) values ($1) returning id", string(body)).Scan(&id)
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
	defer srv.Close()

	// The client, over a network that loses the first answer.
	client, err := idemclient.NewClient(lossy(srv.Client().Transport), nil)
	if err != nil {
		log.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", strings.NewReader(`500`))
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	res, _ := idemclient.ResultOf(resp)
	var charges int
	if err := pool.QueryRow(ctx, "select count(*) from example_charges").Scan(&charges); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d %s attempts=%d replayed=%v charges=%d\n", resp.StatusCode, body, res.Attempts, res.Replayed, charges)
	// Output:
	// 201 {"id":1} attempts=2 replayed=true charges=1
}

// lossy loses the first answer that next receives: the caller sees the
// error of a connection reset after the server acted.
func lossy(next http.RoundTripper) http.RoundTripper {
	var lost atomic.Bool
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil && lost.CompareAndSwap(false, true) {
			resp.Body.Close()
			return nil, errors.New("read: connection reset by peer")
		}
		return resp, err
	})
}

// A key reused for another request is a caller's bug: idem answers 422
// with a problem document, which the client returns at once, never
// retried.
func ExampleProblemOf() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// What idem answers for a key used before with another body.
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, `{"type":"/problems/key-mismatch","title":"Idempotency-Key reused for another request","status":422,`+
			`"detail":"this key was used with a different request; use a new key for a new request"}`)
	}))
	defer srv.Close()

	client, err := idemclient.NewClient(srv.Client().Transport, nil)
	if err != nil {
		log.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":900}`))
	req.Header.Set(idemclient.HeaderKey, `"order-17"`)
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	res, _ := idemclient.ResultOf(resp)
	fmt.Println("attempts:", res.Attempts)
	if p := idemclient.ProblemOf(resp); p != nil {
		var err error = p
		fmt.Println(err)
	}
	// Output:
	// attempts: 1
	// idemclient: 422 Idempotency-Key reused for another request: this key was used with a different request; use a new key for a new request (/problems/key-mismatch)
}
