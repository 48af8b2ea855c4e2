package payments_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttptest"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/settlement"
	"github.com/idemhq/idem/payments_example/internal/spectest"
	"github.com/idemhq/idem/payments_example/processor"
	"github.com/idemhq/idem/testkit/testdb"
)

// TestPaymentsExactlyOnce runs the test kit (idemhttptest) on POST
// /payments, with the handler as the service serves it: idemhttp behind
// the API key's authentication, and a settlement job inserted (River,
// InsertTx) in each payment's transaction. Every request of the kit, and
// every answer, is checked against the spec. Its effects are the payments
// rows of a signed-up account; after each scenario, the account's balance
// must be the opening balance less one amount per execution.
//
// No table is ignored: the handler writes accounts, payments and river_job
// only in the request's transaction, so an attempt the kit rolls back
// leaves none of them changed. The River client is not started, so that no
// job runs: a running job updates river_job and the payment's processor_id
// in transactions of its own (legitimately, after the payment committed),
// and River's leader and queue tables besides, which the kit would report
// as writes outside the request (those tests are in package settlement).
func TestPaymentsExactlyOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	if err := payments.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if err := settlement.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	// The processor is never called: the River client only inserts.
	proc, err := processor.NewClient("http://127.0.0.1:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := settlement.NewClient(pool, proc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	handler, err := payments.NewHandler(pool, keys, &payments.Config{Settler: settlement.NewQueue(jobs), PaymentRate: rate.Inf})
	if err != nil {
		t.Fatal(err)
	}

	const initial, amount = payments.OpeningBalance, 2_500
	accountID, apiKey := signUp(t, handler)
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	idemhttptest.Suite{
		Handler: handler,
		DB:      pool,
		Client:  &http.Client{Transport: spectest.New(t).Transport(t, transport)},
		Request: func(t testing.TB) *http.Request {
			body := fmt.Sprintf(`{"account_id":%q,"amount":%d,"currency":"USD"}`, accountID, amount)
			r, err := http.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer "+apiKey)
			return r
		},
		Effects: func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, "select count(*) from payments where account_id = $1", accountID).Scan(&n)
			return n, err
		},
		Check: func(t testing.TB, s idemhttptest.Scenario) {
			var balance, jobCount int64
			err := pool.QueryRow(t.Context(), `select
				(select balance from accounts where id = $1),
				(select count(*) from river_job where (args->>'account_id')::uuid = $1)`, accountID).Scan(&balance, &jobCount)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(initial - amount*s.TotalExecutions); balance != want {
				t.Errorf("after %s: balance %d, want %d", s.Name, balance, want)
			}
			if jobCount != int64(s.TotalExecutions) {
				t.Errorf("after %s: %d settlement jobs, want one per payment, %d", s.Name, jobCount, s.TotalExecutions)
			}
		},
	}.Run(t)
}

// signUp opens an account (with payments.OpeningBalance) through handler
// and returns it with its API key; the request and the answer are checked
// against the spec.
func signUp(t *testing.T, handler http.Handler) (accountID uuid.UUID, apiKey string) {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/accounts", strings.NewReader(`{"owner": "kit"}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	spectest.New(t).Handler(t, handler).ServeHTTP(rec, req)
	var a api.AccountCreated
	if err := json.Unmarshal(rec.Body.Bytes(), &a); rec.Code != http.StatusCreated || err != nil {
		t.Fatalf("sign up: %d %s (%v)", rec.Code, rec.Body, err)
	}
	return a.Id, a.ApiKey
}
