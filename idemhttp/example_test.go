package idemhttp_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
// request's context: another user who sends the same key gets a charge of
// her own, never the first user's response.
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
	mw, err := idemhttp.NewMiddleware(keys, &idemhttp.Config{
		Required: true,
		Scope:    idemhttp.ContextScope, // the user authenticate put in the context
	})
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
	users := map[string]string{"Bearer token-ada": "user:ada", "Bearer token-grace": "user:grace"}
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			user, ok := users[r.Header.Get("Authorization")] // a real service verifies a credential here
			if !ok {
				w.Header().Set("WWW-Authenticate", "Bearer")
				http.Error(w, "sign in", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r.WithContext(idem.ContextWithScope(r.Context(), user)))
		})
	}
	srv := httptest.NewServer(authenticate(mw.Handler(mux)))
	defer srv.Close()

	for _, token := range []string{"token-ada", "token-ada", "token-grace"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%s: %d %s replayed=%q %s\n", token, resp.StatusCode, resp.Header.Get("Location"),
			resp.Header.Get("Idempotent-Replayed"), body)
	}

	var n int
	if err := pool.QueryRow(ctx, "select count(*) from example_charges").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// token-ada: 201 /charges/1 replayed="" {"id":1,"amount":500}
	// token-ada: 201 /charges/1 replayed="true" {"id":1,"amount":500}
	// token-grace: 201 /charges/2 replayed="" {"id":2,"amount":500}
	// charges: 2
}

// A webhook receiver: GitHub sends every delivery, and its redeliveries,
// with the delivery's GUID in X-GitHub-Delivery. Config.Key takes the key
// from there (a Key function may read it from the body instead, such as a
// Stripe event's "id"), and the scope is the sender, set once the
// delivery's signature is verified. A redelivery is answered with the
// stored response and processed once.
func Example_webhook() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := schema.Apply(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "create table if not exists example_pushes (ref text not null)"); err != nil {
		log.Fatal(err)
	}

	mw, err := idemhttp.NewMiddleware(pool, &idemhttp.Config{
		Required: true,
		Key:      idemhttp.KeyHeader("X-GitHub-Delivery"),
		Scope:    idemhttp.ContextScope, // the sender, set by verify
	})
	if err != nil {
		log.Fatal(err)
	}
	const secret = "the hook's secret"
	signature := func(body []byte) string {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(body)
		return "sha256=" + hex.EncodeToString(m.Sum(nil))
	}
	verify := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil || !hmac.Equal([]byte(r.Header.Get("X-Hub-Signature-256")), []byte(signature(body))) {
				http.Error(w, "bad signature", http.StatusUnauthorized)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			next.ServeHTTP(w, r.WithContext(idem.ContextWithScope(r.Context(), "webhook:github")))
		})
	}
	push := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var event struct {
			Ref string `json:"ref"`
		}
		if err := json.NewDecoder(r.Body).Decode(&event); err != nil {
			http.Error(w, "not a push event", http.StatusBadRequest)
			return
		}
		// The effect, the delivery's key and the answer commit together.
		if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), "insert into example_pushes values ($1)", event.Ref); err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable) // not stored: the redelivery runs it
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	srv := httptest.NewServer(verify(mw.Handler(push)))
	defer srv.Close()

	body := []byte(`{"ref":"refs/heads/main","repository":{"full_name":"octo-org/octo-repo"}}`)
	for range 2 { // the delivery, then its redelivery
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Event", "push")
		req.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
		req.Header.Set("X-Hub-Signature-256", signature(body))
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("%d replayed=%q\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}

	var n int
	if err := pool.QueryRow(ctx, "select count(*) from example_pushes").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("pushes processed:", n)
	// Output:
	// 202 replayed=""
	// 202 replayed="true"
	// pushes processed: 1
}
