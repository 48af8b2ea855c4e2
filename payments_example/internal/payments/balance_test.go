package payments_test

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/payments"
)

// TestBalanceBoundary pins the charge's condition, balance >= amount
// (sql/charge.sql), at its edge, where a mutation of it (> for >=, or the
// condition dropped and left to the CHECK constraint) changes the answer:
// a payment of exactly the balance is charged and leaves 0; one more cent
// is refused 402 and moves nothing; and concurrent payments that together
// exceed the balance by one cent charge all but one, never overdraw, and
// answer balances that each charge took in turn.
func TestBalanceBoundary(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)

	t.Run("exactly the balance", func(t *testing.T) {
		a := e.signUp("exact", 10_000)
		res := e.pay(a.ApiKey, "exact-1", payment(a.Id, 10_000))
		if res.status != http.StatusCreated {
			t.Fatalf("paying the whole balance: %d %s", res.status, res.body)
		}
		var p api.Payment
		decodeInto(t, res, &p)
		if p.Balance != 0 {
			t.Errorf("answered balance %d, want 0", p.Balance)
		}
		if got, n := e.balance(a.Id), e.payments(a.Id); got != 0 || n != 1 {
			t.Fatalf("balance %d with %d payments, want 0 and 1", got, n)
		}
		// Then a single cent is too much.
		wantProblem(t, e.pay(a.ApiKey, "exact-2", payment(a.Id, 1)), http.StatusPaymentRequired, payments.ProblemInsufficientFunds)
		if got, n := e.balance(a.Id), e.payments(a.Id); got != 0 || n != 1 {
			t.Fatalf("after a cent on an empty account: balance %d with %d payments, want 0 and 1", got, n)
		}
	})

	t.Run("one cent more than the balance", func(t *testing.T) {
		a := e.signUp("over", 10_000)
		wantProblem(t, e.pay(a.ApiKey, "over-1", payment(a.Id, 10_001)), http.StatusPaymentRequired, payments.ProblemInsufficientFunds)
		if got, n := e.balance(a.Id), e.payments(a.Id); got != 10_000 || n != 0 {
			t.Fatalf("balance %d with %d payments, want 10000 and none", got, n)
		}
	})

	t.Run("concurrently one cent over", func(t *testing.T) {
		const n, amount = 20, 500
		const opening = n*amount - 1 // the n payments exceed it by one cent
		a := e.signUp("race", opening)
		answers := make([]response, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { answers[i] = e.pay(a.ApiKey, fmt.Sprintf("race-%d", i), payment(a.Id, amount)) })
		}
		wg.Wait()

		var balances []int64
		refused := 0
		for i, res := range answers {
			switch res.status {
			case http.StatusCreated:
				var p api.Payment
				decodeInto(t, res, &p)
				balances = append(balances, p.Balance)
			case http.StatusPaymentRequired:
				wantProblem(t, res, http.StatusPaymentRequired, payments.ProblemInsufficientFunds)
				refused++
			default:
				t.Errorf("payment %d: %d %s, want 201 or 402", i, res.status, res.body)
			}
		}
		if len(balances) != n-1 || refused != 1 {
			t.Fatalf("%d charged and %d refused, want %d and 1", len(balances), refused, n-1)
		}
		// Each charge saw the balance the one before it left: the answered
		// balances are opening - k*amount for k = 1..n-1, once each.
		slices.Sort(balances)
		for k := range n - 1 {
			if want := int64(amount - 1 + k*amount); balances[k] != want {
				t.Fatalf("answered balances %v, want %d, %d, ... %d once each", balances, amount-1, 2*amount-1, opening-amount)
			}
		}
		if got, p := e.balance(a.Id), e.payments(a.Id); got != amount-1 || p != n-1 {
			t.Fatalf("balance %d with %d payments, want %d and %d", got, p, amount-1, n-1)
		}
	})
}
