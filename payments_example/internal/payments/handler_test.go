package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/internal/testdb"
	"github.com/idemhq/idem/payments_example/internal/payments"
)

// env is one test's service: its own database, the handler under test
// served by httptest, and the pool to check the database with.
type env struct {
	t    *testing.T
	pool *pgxpool.Pool
	srv  *httptest.Server
}

func setup(t *testing.T, handler func(*pgxpool.Pool) http.Handler) *env {
	t.Helper()
	pool := testdb.New(t)
	if err := payments.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler(pool))
	t.Cleanup(srv.Close)
	return &env{t: t, pool: pool, srv: srv}
}

func protected(pool *pgxpool.Pool) http.Handler   { return payments.NewHandler(pool, nil) }
func unprotected(pool *pgxpool.Pool) http.Handler { return payments.NewUnprotectedHandler(pool, nil) }

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// do sends one request; key "" sends no Idempotency-Key header. It is safe
// to call from several goroutines.
func (e *env) do(method, path, key, body string) response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.t.Context(), method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Error(err)
		return response{}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Error(err)
		return response{}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Error(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func (e *env) createAccount(owner string, balance int64) payments.Account {
	e.t.Helper()
	res := e.do("POST", "/accounts", "", fmt.Sprintf(`{"owner": %q, "balance": %d}`, owner, balance))
	if res.status != http.StatusCreated {
		e.t.Fatalf("create account: %d %s", res.status, res.body)
	}
	var a payments.Account
	decodeInto(e.t, res, &a)
	return a
}

// balance and payments read the truth from the database, not from the API.
func (e *env) balance(accountID int64) int64 {
	e.t.Helper()
	var b int64
	if err := e.pool.QueryRow(e.t.Context(), "select balance from accounts where id = $1", accountID).Scan(&b); err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) payments(accountID int64) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.t.Context(), "select count(*) from payments where account_id = $1", accountID).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func decodeInto(t *testing.T, res response, v any) {
	t.Helper()
	if err := json.Unmarshal(res.body, v); err != nil {
		t.Fatalf("decode %s: %v", res.body, err)
	}
}

func payment(accountID, amount int64) string {
	return fmt.Sprintf(`{"account_id": %d, "amount": %d, "currency": "USD"}`, accountID, amount)
}

// wantProblem checks an error answer: its status, problem+json, and the
// problem's type.
func wantProblem(t *testing.T, res response, status int, typ string) {
	t.Helper()
	if res.status != status {
		t.Fatalf("status %d, want %d; body %s", res.status, status, res.body)
	}
	if ct := res.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	decodeInto(t, res, &p)
	if p.Type != typ || p.Status != status {
		t.Errorf("problem %s, want type %q and status %d", res.body, typ, status)
	}
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	if res := e.do("GET", "/healthz", "", ""); res.status != http.StatusOK {
		t.Fatalf("GET /healthz: %d %s", res.status, res.body)
	}
}

func TestAccounts(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)

	t.Run("create and read", func(t *testing.T) {
		a := e.createAccount("ada", 5000)
		if a.ID <= 0 || a.Owner != "ada" || a.Balance != 5000 {
			t.Fatalf("created %+v", a)
		}
		res := e.do("GET", fmt.Sprintf("/accounts/%d", a.ID), "", "")
		var got payments.Account
		decodeInto(t, res, &got)
		if res.status != http.StatusOK || got != a {
			t.Fatalf("GET: %d %+v, want %+v", res.status, got, a)
		}
	})

	t.Run("unknown account is 404", func(t *testing.T) {
		wantProblem(t, e.do("GET", "/accounts/999999", "", ""), http.StatusNotFound, payments.ProblemNoSuchAccount)
		wantProblem(t, e.do("GET", "/accounts/abc", "", ""), http.StatusNotFound, payments.ProblemNoSuchAccount)
	})

	t.Run("invalid input is 400", func(t *testing.T) {
		for name, body := range map[string]string{
			"empty owner":      `{"owner": " ", "balance": 1}`,
			"missing owner":    `{"balance": 1}`,
			"negative balance": `{"owner": "bob", "balance": -1}`,
			"missing balance":  `{"owner": "bob"}`,
			"fractional":       `{"owner": "bob", "balance": 1.5}`,
			"unknown field":    `{"owner": "bob", "balance": 1, "overdraft": 100}`,
			"malformed":        `{"owner": "bob",`,
			"two documents":    `{"owner": "bob", "balance": 1} {}`,
		} {
			t.Run(name, func(t *testing.T) {
				wantProblem(t, e.do("POST", "/accounts", "", body), http.StatusBadRequest, payments.ProblemInvalidRequest)
			})
		}
	})

	t.Run("with a key it is created once", func(t *testing.T) {
		body := `{"owner": "grace", "balance": 700}`
		first := e.do("POST", "/accounts", "acct-key-1", body)
		again := e.do("POST", "/accounts", "acct-key-1", body)
		if first.status != http.StatusCreated || again.status != http.StatusCreated {
			t.Fatalf("statuses %d, %d", first.status, again.status)
		}
		if !bytes.Equal(first.body, again.body) || !again.replayed() || first.replayed() {
			t.Fatalf("replay: %s (replayed=%v), first %s", again.body, again.replayed(), first.body)
		}
		var n int
		if err := e.pool.QueryRow(t.Context(), "select count(*) from accounts where owner = 'grace'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("%d accounts created, want 1", n)
		}
	})

	t.Run("body over 1 MiB is 413", func(t *testing.T) {
		big := `{"owner": "` + strings.Repeat("x", payments.MaxBodyBytes) + `", "balance": 1}`
		wantProblem(t, e.do("POST", "/accounts", "", big), http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
		wantProblem(t, e.do("POST", "/accounts", "big-account", big), http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
	})
}

func TestPayments(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)

	t.Run("charged once, replayed after", func(t *testing.T) {
		a := e.createAccount("ada", 10_000)
		first := e.do("POST", "/payments", "pay-1", payment(a.ID, 2500))
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("first: %d replayed=%v %s", first.status, first.replayed(), first.body)
		}
		var p payments.Payment
		decodeInto(t, first, &p)
		if p.ID <= 0 || p.AccountID != a.ID || p.Amount != 2500 || p.Balance != 7500 {
			t.Fatalf("payment %+v", p)
		}
		for range 3 {
			again := e.do("POST", "/payments", "pay-1", payment(a.ID, 2500))
			if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, first.body) {
				t.Fatalf("replay: %d replayed=%v %s, want the first body %s", again.status, again.replayed(), again.body, first.body)
			}
		}
		if got := e.balance(a.ID); got != 7500 {
			t.Fatalf("balance %d, want 7500", got)
		}
		if n := e.payments(a.ID); n != 1 {
			t.Fatalf("%d payments, want 1", n)
		}
	})

	t.Run("insufficient funds is 402, stored and replayed", func(t *testing.T) {
		a := e.createAccount("bob", 100)
		first := e.do("POST", "/payments", "pay-poor", payment(a.ID, 101))
		wantProblem(t, first, http.StatusPaymentRequired, payments.ProblemInsufficientFunds)
		// Money arrives, but the key's answer stays the stored refusal.
		if _, err := e.pool.Exec(t.Context(), "update accounts set balance = 1000 where id = $1", a.ID); err != nil {
			t.Fatal(err)
		}
		again := e.do("POST", "/payments", "pay-poor", payment(a.ID, 101))
		wantProblem(t, again, http.StatusPaymentRequired, payments.ProblemInsufficientFunds)
		if !again.replayed() || !bytes.Equal(again.body, first.body) {
			t.Fatalf("replay: replayed=%v %s, want %s", again.replayed(), again.body, first.body)
		}
		if got, n := e.balance(a.ID), e.payments(a.ID); got != 1000 || n != 0 {
			t.Fatalf("balance %d with %d payments, want 1000 and none", got, n)
		}
	})

	t.Run("unknown account is 404", func(t *testing.T) {
		wantProblem(t, e.do("POST", "/payments", "pay-nobody", payment(999999, 1)), http.StatusNotFound, payments.ProblemNoSuchAccount)
	})

	t.Run("key", func(t *testing.T) {
		a := e.createAccount("carol", 1000)
		t.Run("missing is 400", func(t *testing.T) {
			wantProblem(t, e.do("POST", "/payments", "", payment(a.ID, 1)), http.StatusBadRequest, idemhttp.ProblemMissingKey)
		})
		t.Run("invalid is 400", func(t *testing.T) {
			wantProblem(t, e.do("POST", "/payments", strings.Repeat("k", 256), payment(a.ID, 1)), http.StatusBadRequest, idemhttp.ProblemInvalidKey)
		})
		t.Run("reused with another body is 422", func(t *testing.T) {
			if res := e.do("POST", "/payments", "pay-reuse", payment(a.ID, 10)); res.status != http.StatusCreated {
				t.Fatalf("first: %d %s", res.status, res.body)
			}
			wantProblem(t, e.do("POST", "/payments", "pay-reuse", payment(a.ID, 20)), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
		})
		if got := e.balance(a.ID); got != 990 {
			t.Fatalf("balance %d, want 990", got)
		}
	})

	t.Run("invalid body is 400", func(t *testing.T) {
		a := e.createAccount("dan", 1000)
		for name, body := range map[string]string{
			"malformed":          `{"account_id": `,
			"zero amount":        fmt.Sprintf(`{"account_id": %d, "amount": 0, "currency": "USD"}`, a.ID),
			"negative amount":    fmt.Sprintf(`{"account_id": %d, "amount": -5, "currency": "USD"}`, a.ID),
			"fractional amount":  fmt.Sprintf(`{"account_id": %d, "amount": 1.5, "currency": "USD"}`, a.ID),
			"string amount":      fmt.Sprintf(`{"account_id": %d, "amount": "5", "currency": "USD"}`, a.ID),
			"other currency":     fmt.Sprintf(`{"account_id": %d, "amount": 5, "currency": "EUR"}`, a.ID),
			"missing currency":   fmt.Sprintf(`{"account_id": %d, "amount": 5}`, a.ID),
			"missing account_id": `{"amount": 5, "currency": "USD"}`,
			"unknown field":      fmt.Sprintf(`{"account_id": %d, "amount": 5, "currency": "USD", "note": "x"}`, a.ID),
		} {
			t.Run(name, func(t *testing.T) {
				wantProblem(t, e.do("POST", "/payments", "bad-"+name, body), http.StatusBadRequest, payments.ProblemInvalidRequest)
			})
		}
		if got := e.balance(a.ID); got != 1000 {
			t.Fatalf("balance %d, want 1000", got)
		}
	})

	t.Run("body over 1 MiB is 413", func(t *testing.T) {
		big := `{"account_id": 1, "amount": 1, "currency": "USD", "pad": "` + strings.Repeat("x", payments.MaxBodyBytes) + `"}`
		wantProblem(t, e.do("POST", "/payments", "pay-big", big), http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
	})
}

// TestPaymentInFlight holds the account's row lock so that a first payment
// stops inside its transaction, key claimed; a second request with the key
// meets it there.
func TestPaymentInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.createAccount("erin", 1000)

	lock, err := e.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
	if _, err := lock.Exec(t.Context(), "select 1 from accounts where id = $1 for update", a.ID); err != nil {
		t.Fatal(err)
	}

	firstDone := make(chan response, 1)
	go func() { firstDone <- e.do("POST", "/payments", "pay-slow", payment(a.ID, 300)) }()
	waitForLockWait(t, e.pool)

	wantProblem(t, e.do("POST", "/payments", "pay-slow", payment(a.ID, 300)), http.StatusConflict, idemhttp.ProblemInProgress)

	if err := lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	first := <-firstDone
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	again := e.do("POST", "/payments", "pay-slow", payment(a.ID, 300))
	if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, first.body) {
		t.Fatalf("after the first finished: %d replayed=%v %s", again.status, again.replayed(), again.body)
	}
	if got := e.balance(a.ID); got != 700 {
		t.Fatalf("balance %d, want 700", got)
	}
}

// waitForLockWait returns once a session of the test's database waits for a
// row lock. It polls; the deadline only bounds a broken run.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for range 3000 {
		var waiting bool
		err := pool.QueryRow(t.Context(), `select exists (
			select 1 from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock')`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the first payment never reached the account's row lock")
}

// TestConcurrentPaymentsNeverOverdraw sends 50 payments of 100 at once
// against a balance of 1000: exactly 10 succeed, and the balance ends at 0.
func TestConcurrentPaymentsNeverOverdraw(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.createAccount("frank", 1000)

	const n = 50
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			statuses[i] = e.do("POST", "/payments", fmt.Sprintf("overdraw-%d", i), payment(a.ID, 100)).status
		})
	}
	wg.Wait()

	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	if count[http.StatusCreated] != 10 || count[http.StatusPaymentRequired] != 40 {
		t.Fatalf("statuses %v, want 10×201 and 40×402", count)
	}
	if got, p := e.balance(a.ID), e.payments(a.ID); got != 0 || p != 10 {
		t.Fatalf("balance %d with %d payments, want 0 and 10", got, p)
	}
}

// TestSameKeyConcurrently sends one payment from 20 goroutines at once with
// the same key, each retrying while the key is in progress (409): the
// account is charged once and every caller receives the same answer.
func TestSameKeyConcurrently(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.createAccount("gina", 1000)

	const n = 20
	results := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for range 1000 {
				results[i] = e.do("POST", "/payments", "same-key", payment(a.ID, 250))
				if results[i].status != http.StatusConflict {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()

	replays := 0
	for i, res := range results {
		if res.status != http.StatusCreated || !bytes.Equal(res.body, results[0].body) {
			t.Fatalf("caller %d: %d %s, want 201 %s", i, res.status, res.body, results[0].body)
		}
		if res.replayed() {
			replays++
		}
	}
	if replays != n-1 {
		t.Errorf("%d replays, want %d", replays, n-1)
	}
	if got, p := e.balance(a.ID), e.payments(a.ID); got != 750 || p != 1 {
		t.Fatalf("balance %d with %d payments, want 750 and 1", got, p)
	}
}

// TestUnprotectedChargesEveryRetry documents what the key prevents: without
// idemhttp, a retried payment is a second charge.
func TestUnprotectedChargesEveryRetry(t *testing.T) {
	t.Parallel()
	e := setup(t, unprotected)
	a := e.createAccount("hal", 1000)
	for range 2 {
		if res := e.do("POST", "/payments", "retried", payment(a.ID, 100)); res.status != http.StatusCreated {
			t.Fatalf("%d %s", res.status, res.body)
		}
	}
	if got, p := e.balance(a.ID), e.payments(a.ID); got != 800 || p != 2 {
		t.Fatalf("balance %d with %d payments, want 800 and 2", got, p)
	}
}

// TestBalanceNeverNegativeInSchema checks the last line of defence: even a
// write that bypasses the charge statement cannot overdraw an account.
func TestBalanceNeverNegativeInSchema(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.createAccount("ivy", 10)
	_, err := e.pool.Exec(t.Context(), "update accounts set balance = balance - 11 where id = $1", a.ID)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.CheckViolation {
		t.Fatalf("overdrawing update: %v, want a check violation", err)
	}
}
