package payments_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/payments_example/internal/payments"
)

// TestOthersAccountNotStored is the review's finding: four workers sent
// POST /payments with 255-byte keys naming another account, and every 404
// was stored under its key, about 1.5 KB each, at the caller's pace. The
// 404 is now answered without storing anything, and moves no money.
func TestOthersAccountNotStored(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	mallory := e.signUp("mallory", 1000)
	alice := e.signUp("alice", 1000)
	const workers, each = 4, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("%d-%d-", w, i)
				key += strings.Repeat("k", 255-len(key))
				target := alice.Id
				if i%2 == 1 {
					target = uuid.New() // no account at all: the same answer
				}
				wantProblem(t, e.pay(mallory.ApiKey, key, payment(target, 1)), http.StatusNotFound, payments.ProblemNoSuchAccount)
			}
		})
	}
	wg.Wait()
	if n := e.keys(); n != 0 {
		t.Fatalf("%d keys stored by %d refusals naming another account", n, workers*each)
	}
	if a, m := e.balance(alice.Id), e.balance(mallory.Id); a != 1000 || m != 1000 || e.payments(alice.Id)+e.payments(mallory.Id) != 0 {
		t.Fatalf("balances %d and %d after the refusals, want 1000 each and no payment", a, m)
	}
}

// TestRateLimit is the review's finding: nothing bounded how many keys one
// account could make the service store. POST /payments is now limited per
// account: beyond the burst the answer is 429, problem+json, with a
// Retry-After in whole seconds; nothing runs and nothing is stored; and
// another account keeps its own allowance.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	const burst = 3
	e := setup(t, func(t testing.TB, pool *pgxpool.Pool) http.Handler {
		keys, err := idem.NewClient(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		// One payment an hour after the burst: no token comes back
		// while the test runs.
		h, err := payments.NewHandler(pool, keys, &payments.Config{PaymentRate: rate.Every(3600e9), PaymentBurst: burst})
		if err != nil {
			t.Fatal(err)
		}
		return h
	})
	a := e.signUp("busy", 1000)
	b := e.signUp("calm", 1000)
	for i := range burst {
		if res := e.pay(a.ApiKey, fmt.Sprintf("limit-%d", i), payment(a.Id, 1)); res.status != http.StatusCreated {
			t.Fatalf("payment %d of the burst: %d %s", i+1, res.status, res.body)
		}
	}
	for _, key := range []string{"limit-over", "limit-0"} { // a new key, and a replay: neither gets through
		res := e.pay(a.ApiKey, key, payment(a.Id, 1))
		wantProblem(t, res, http.StatusTooManyRequests, payments.ProblemTooManyRequests)
		if s, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || s < 1 || s > 3600 {
			t.Errorf("Retry-After %q, want whole seconds up to 3600", res.header.Get("Retry-After"))
		}
	}
	if n, bal := e.keys(), e.balance(a.Id); n != burst || bal != 1000-burst {
		t.Fatalf("%d keys and balance %d after the limit, want %d and %d", n, bal, burst, 1000-burst)
	}
	if res := e.pay(b.ApiKey, "limit-0", payment(b.Id, 1)); res.status != http.StatusCreated {
		t.Fatalf("another account under its own limit: %d %s", res.status, res.body)
	}
}
