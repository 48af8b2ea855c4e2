package payments_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/processor"
)

// TestGetPayment checks GET /payments/{id}: a payment of a service without
// a processor is not settled (settled false, processor_id null); another
// account's payment, a missing one and an id that is not a UUID are the
// same 404; without an API key it is 401.
func TestGetPayment(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	alice := e.signUp("alice", 1000)
	mallory := e.signUp("mallory", 1000)
	paid := e.pay(alice.ApiKey, "get-1", payment(alice.Id, 250))
	if paid.status != http.StatusCreated {
		t.Fatalf("pay: %d %s", paid.status, paid.body)
	}
	var p api.Payment
	decodeInto(t, paid, &p)

	res := e.send(request{method: "GET", path: "/payments/" + p.Id.String(), auth: alice.ApiKey})
	if res.status != http.StatusOK {
		t.Fatalf("GET: %d %s", res.status, res.body)
	}
	var got api.PaymentStatus
	decodeInto(t, res, &got)
	want := api.PaymentStatus{Id: p.Id, AccountId: alice.Id, Amount: 250, Settled: false}
	if got != want || !bytes.Contains(res.body, []byte(`"processor_id":null`)) {
		t.Fatalf("GET: %s, want %+v with processor_id null", res.body, want)
	}

	foreign := e.send(request{method: "GET", path: "/payments/" + p.Id.String(), auth: mallory.ApiKey})
	wantProblem(t, foreign, http.StatusNotFound, payments.ProblemNoSuchPayment)
	missing := e.send(request{method: "GET", path: "/payments/" + uuid.NewString(), auth: alice.ApiKey})
	wantProblem(t, missing, http.StatusNotFound, payments.ProblemNoSuchPayment)
	if !bytes.Equal(foreign.body, missing.body) {
		t.Errorf("another account's payment %s differs from a missing one %s", foreign.body, missing.body)
	}
	wantProblem(t, e.send(request{method: "GET", path: "/payments/abc", auth: alice.ApiKey, invalid: true}), http.StatusNotFound, payments.ProblemNoSuchPayment)
	res = e.send(request{method: "GET", path: "/payments/" + p.Id.String()})
	wantProblem(t, res, http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
}

// settler is a payments.Settler that records a fake charge on the payment
// in the payment's transaction, or fails on the attempts it is told to.
type settler struct {
	calls  atomic.Int64
	failOn func(call int64) bool
}

func (s *settler) Settle(ctx context.Context, tx pgx.Tx, c processor.Charge) error {
	n := s.calls.Add(1)
	// The key the processor's key would be derived from is in ctx.
	if _, ok := idem.KeyFromContext(ctx); !ok {
		return errors.New("no idempotency key in the settler's context")
	}
	if _, err := tx.Exec(ctx, "update payments set processor_id = $2 where id = $1", c.PaymentID, "ch_"+c.PaymentID.String()); err != nil {
		return err
	}
	if s.failOn != nil && s.failOn(n) {
		return errors.New("settlement failed")
	}
	return nil
}

// TestSettlerRunsInThePaymentsTransaction checks the Settler contract:
// Settle runs in the payment's transaction with the request's key in its
// context; what it writes commits with the payment; when it fails, the
// payment is answered 503, nothing commits (neither the payment nor what
// Settle wrote) and the key stays free, so the retry with the same key
// pays, and settles, once.
func TestSettlerRunsInThePaymentsTransaction(t *testing.T) {
	t.Parallel()
	s := &settler{failOn: func(call int64) bool { return call == 1 }}
	e := setup(t, func(t testing.TB, pool *pgxpool.Pool) http.Handler {
		keys, err := idem.NewClient(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		h, err := payments.NewHandler(pool, keys, &payments.Config{Settler: s, PaymentRate: rate.Inf})
		if err != nil {
			t.Fatal(err)
		}
		return h
	})
	a := e.signUp("ada", 1000)

	failed := e.pay(a.ApiKey, "settle-1", payment(a.Id, 100))
	wantProblem(t, failed, http.StatusServiceUnavailable, idemhttp.ProblemUnavailable)
	if got, n, k := e.balance(a.Id), e.payments(a.Id), e.keys(); got != 1000 || n != 0 || k != 0 {
		t.Fatalf("after a failed settlement: balance %d, %d payments, %d keys; want nothing committed", got, n, k)
	}
	ok := e.pay(a.ApiKey, "settle-1", payment(a.Id, 100))
	if ok.status != http.StatusCreated || ok.replayed() {
		t.Fatalf("retry: %d replayed=%v %s", ok.status, ok.replayed(), ok.body)
	}
	again := e.pay(a.ApiKey, "settle-1", payment(a.Id, 100))
	if !again.replayed() || s.calls.Load() != 2 {
		t.Fatalf("replay: replayed=%v after %d Settle calls, want a replay and 2 calls", again.replayed(), s.calls.Load())
	}
	var p api.Payment
	decodeInto(t, ok, &p)
	var got api.PaymentStatus
	decodeInto(t, e.send(request{method: "GET", path: "/payments/" + p.Id.String(), auth: a.ApiKey}), &got)
	if !got.Settled || got.ProcessorId == nil || *got.ProcessorId != "ch_"+p.Id.String() {
		t.Fatalf("GET: %+v, want settled by ch_%s", got, p.Id)
	}
	if bal, n := e.balance(a.Id), e.payments(a.Id); bal != 900 || n != 1 {
		t.Fatalf("balance %d with %d payments, want 900 and 1", bal, n)
	}
}
