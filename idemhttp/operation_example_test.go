package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/schema"
)

// A charge as an operation made of steps: a reservation in the database,
// then the card processor's call with no transaction open. While the
// processor takes its time, a retry that prefers an asynchronous answer
// (Prefer: respond-async) gets 202 with a Location to poll instead of
// 409; the poll answers 202 until the charge is done, then the stored
// answer, which every retry receives too.
func Example_operation() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := schema.Apply(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "create table if not exists example_reservations (key text not null, amount int not null)"); err != nil {
		log.Fatal(err)
	}

	// The card processor: it honours idempotency keys, and this one is
	// slow until released.
	var (
		mu      sync.Mutex
		charges = map[string]string{}
		calling = make(chan struct{})
		release = make(chan struct{})
	)
	chargeCard := func(_ context.Context, key string, _ int) (string, error) {
		calling <- struct{}{}
		<-release
		mu.Lock()
		defer mu.Unlock()
		if _, ok := charges[key]; !ok {
			charges[key] = fmt.Sprintf("ch_%d", len(charges)+1)
		}
		return charges[key], nil
	}

	type chargeRequest struct {
		Amount int `json:"amount"`
	}
	type chargeResult struct {
		ChargeID string `json:"charge_id"`
		Amount   int    `json:"amount"`
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	op, err := idem.NewOperation(keys, "charge", func(s *idem.Steps, req chargeRequest) (chargeResult, error) {
		if _, err := idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, "insert into example_reservations values ($1, $2)", s.Key().Key, req.Amount)
			return req.Amount, err
		}); err != nil {
			return chargeResult{}, err
		}
		id, err := idem.External(s, "charge", func(ctx context.Context, key string) (string, error) {
			return chargeCard(ctx, key, req.Amount) // key: derived from the request's, the same on every retry
		})
		return chargeResult{ChargeID: id, Amount: req.Amount}, err
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	h, err := idemhttp.NewOperationHandler(op, &idemhttp.Config{Scope: idemhttp.ContextScope},
		&idemhttp.OperationOptions[chargeRequest, chargeResult]{
			StatusURL: func(ref idem.OperationRef) string { return "/payments/operations/" + url.PathEscape(ref.Key) },
		})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", h)
	mux.HandleFunc("GET /payments/operations/{key}", h.ServeStatus)
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// A real service verifies a credential here.
			next.ServeHTTP(w, r.WithContext(idem.ContextWithScope(r.Context(), "user:ada")))
		})
	}
	srv := httptest.NewServer(authenticate(mux))
	defer srv.Close()

	send := func(method, path string, header ...string) string {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(`{"amount":500}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "0d3c5e1a-example-operation")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d [%s] location=%q replayed=%q", resp.StatusCode, body,
			resp.Header.Get("Location"), resp.Header.Get("Idempotent-Replayed"))
	}

	first := make(chan string)
	go func() { first <- send(http.MethodPost, "/payments") }()
	<-calling // the first request is at the processor
	fmt.Println("retry:", send(http.MethodPost, "/payments", "Prefer", "respond-async"))
	fmt.Println("poll: ", send(http.MethodGet, "/payments/operations/0d3c5e1a-example-operation"))
	close(release)
	fmt.Println("first:", <-first)
	fmt.Println("poll: ", send(http.MethodGet, "/payments/operations/0d3c5e1a-example-operation"))
	fmt.Println("retry:", send(http.MethodPost, "/payments"))
	fmt.Println("charges at the processor:", len(charges))
	// Output:
	// retry: 202 [] location="/payments/operations/0d3c5e1a-example-operation" replayed=""
	// poll:  202 [] location="" replayed=""
	// first: 200 [{"charge_id":"ch_1","amount":500}] location="" replayed=""
	// poll:  200 [{"charge_id":"ch_1","amount":500}] location="" replayed="true"
	// retry: 200 [{"charge_id":"ch_1","amount":500}] location="" replayed="true"
	// charges at the processor: 1
}
