package idemhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/schema"
)

// A service method made idempotent with idem.Wrap, served by a plain
// handler without the middleware: WriteOutcome answers what the call
// returned as the middleware would (the replay header, the stored refusal,
// 409, 422, 503), and the handler writes only its success.
func ExampleWriteOutcome() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := schema.Apply(ctx, pool); err != nil {
		log.Fatal(err)
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	type chargeReq struct {
		Amount int `json:"amount"`
	}
	type chargeResp struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	charge := idem.Wrap(keys, "example.charge", func(_ context.Context, _ pgx.Tx, req chargeReq) (chargeResp, error) {
		if req.Amount > 1000 {
			return chargeResp{}, idem.Refuse("amount_too_large", "the amount is above the limit").WithStatus(http.StatusPaymentRequired)
		}
		return chargeResp{ID: "ch_1", Amount: req.Amount}, nil // a real method writes through the transaction
	})

	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		key, err := idemhttp.ParseKey(r.Header)
		var req chargeReq
		if err != nil || key == "" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "a key and a JSON body, please", http.StatusBadRequest)
			return
		}
		ctx := idem.ContextWithScope(r.Context(), "user:ada") // the authenticated user
		resp, outcome, err := charge(ctx, key, req)
		if idemhttp.WriteOutcome(w, r, outcome, err) {
			return // a problem document; log err if it is a 5xx
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(resp)
	})

	post := func(key, body string) {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
		req.Header.Set(idemhttp.HeaderKey, key)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Printf("%d replayed=%q %s\n", rec.Code, rec.Header().Get(idemhttp.HeaderReplayed), strings.TrimSpace(rec.Body.String()))
	}
	post("order-1", `{"amount":500}`)
	post("order-1", `{"amount":500}`)
	post("order-1", `{"amount":900}`)
	post("order-2", `{"amount":5000}`)
	post("order-2", `{"amount":5000}`)
	// Output:
	// 201 replayed="" {"id":"ch_1","amount":500}
	// 201 replayed="true" {"id":"ch_1","amount":500}
	// 422 replayed="" {"type":"/problems/key-mismatch","title":"Idempotency-Key reused for another request","status":422,"detail":"this key was used with a different request; use a new key for a new request"}
	// 402 replayed="" {"type":"/problems/refused","title":"Request refused","status":402,"detail":"the amount is above the limit","code":"amount_too_large"}
	// 402 replayed="true" {"type":"/problems/refused","title":"Request refused","status":402,"detail":"the amount is above the limit","code":"amount_too_large"}
}
