package settlement_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/settlement"
	"github.com/idemhq/idem/payments_example/internal/spectest"
	"github.com/idemhq/idem/payments_example/processor"
)

// liveness bounds the waits below: not a timing assertion, only a limit on
// a broken run.
const liveness = 60 * time.Second

// service is the payments API over a database with a fake processor.
type service struct {
	t      *testing.T
	pool   *pgxpool.Pool
	fake   *processor.Fake
	proc   *processor.Client
	srv    *httptest.Server
	client *http.Client // checks every request and answer against the spec
}

// newService starts the payments API on a new database, with a fake
// processor configured by cfg and the Settler that settle makes from it
// (nil: none).
func newService(t *testing.T, cfg processor.FakeConfig, settle func(s *service) payments.Settler) *service {
	t.Helper()
	pool := migrated(t)
	if err := payments.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	fake, err := processor.NewFake(cfg)
	if err != nil {
		t.Fatal(err)
	}
	procSrv := httptest.NewServer(fake)
	t.Cleanup(procSrv.Close)
	proc, err := processor.NewClient(procSrv.URL, procSrv.Client())
	if err != nil {
		t.Fatal(err)
	}
	s := &service{t: t, pool: pool, fake: fake, proc: proc}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var settler payments.Settler
	if settle != nil {
		settler = settle(s)
	}
	h, err := payments.NewHandler(pool, keys, &payments.Config{Settler: settler, PaymentRate: rate.Inf})
	if err != nil {
		t.Fatal(err)
	}
	s.srv = httptest.NewServer(h)
	t.Cleanup(s.srv.Close)
	s.client = &http.Client{Transport: spectest.New(t).Transport(t, s.srv.Client().Transport)}
	return s
}

// jobs starts the settlement River client of s, stopped when t ends.
func (s *service) jobs() *river.Client[pgx.Tx] {
	s.t.Helper()
	rc, err := settlement.NewClient(s.pool, s.proc, nil, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := rc.Start(context.WithoutCancel(s.t.Context())); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), liveness)
		defer cancel()
		if err := rc.Stop(ctx); err != nil {
			s.t.Error(err)
		}
	})
	return rc
}

func (s *service) do(method, path, apiKey, key, body string) (int, []byte) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.t.Context(), method, s.srv.URL+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := s.client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return res.StatusCode, b
}

// signUp opens an account and sets its balance (in the database: sign-up
// opens every account with payments.OpeningBalance).
func (s *service) signUp(balance int64) api.AccountCreated {
	s.t.Helper()
	status, body := s.do("POST", "/accounts", "", "", `{"owner": "ada"}`)
	var a api.AccountCreated
	if err := json.Unmarshal(body, &a); err != nil || status != http.StatusCreated {
		s.t.Fatalf("sign up: %d %s", status, body)
	}
	if _, err := s.pool.Exec(s.t.Context(), "update accounts set balance = $2 where id = $1", a.Id, balance); err != nil {
		s.t.Fatal(err)
	}
	a.Balance = balance
	return a
}

func (s *service) pay(a api.AccountCreated, key string, amount int64) (int, api.Payment) {
	s.t.Helper()
	status, body := s.do("POST", "/payments", a.ApiKey, key, fmt.Sprintf(`{"account_id": %q, "amount": %d, "currency": "USD"}`, a.Id, amount))
	var p api.Payment
	if status == http.StatusCreated {
		if err := json.Unmarshal(body, &p); err != nil {
			s.t.Fatal(err)
		}
	}
	return status, p
}

func (s *service) get(a api.AccountCreated, id uuid.UUID) api.PaymentStatus {
	s.t.Helper()
	status, body := s.do("GET", "/payments/"+id.String(), a.ApiKey, "", "")
	var p api.PaymentStatus
	if err := json.Unmarshal(body, &p); err != nil || status != http.StatusOK {
		s.t.Fatalf("GET /payments/%s: %d %s", id, status, body)
	}
	return p
}

// waitSettled polls GET /payments/{id} until every payment of ids is
// settled, and returns what it answered last.
func (s *service) waitSettled(a api.AccountCreated, ids []uuid.UUID) map[uuid.UUID]api.PaymentStatus {
	s.t.Helper()
	deadline := time.Now().Add(liveness)
	got := map[uuid.UUID]api.PaymentStatus{}
	for {
		pending := 0
		for _, id := range ids {
			if p, ok := got[id]; !ok || !p.Settled {
				got[id] = s.get(a, id)
				if !got[id].Settled {
					pending++
				}
			}
		}
		if pending == 0 {
			return got
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%d of %d payments still unsettled after %v", pending, len(ids), liveness)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSettleExactlyOnce runs the service with a processor that fails 30%
// of the calls before charging and loses 30% of the answers after
// charging. Every committed payment is charged exactly once at the
// processor, under the key derived from its request's, and GET
// /payments/{id} shows it settled with that charge; a refused payment
// (402) has no job and no charge; every job completed.
//
// The fake decides by the seed, the key and the call number, and the keys
// derive from the account's random id, so the seed does not fix which calls
// fail: 20 payments see no 503 or no lost answer about once in 600 runs.
// Payments go on in batches of 20, each settled before the next, until the
// processor has done both, 200 at most.
func TestSettleExactlyOnce(t *testing.T) {
	t.Parallel()
	s := newService(t, processor.FakeConfig{FailRate: 0.3, LoseRate: 0.3, Seed: 11}, func(s *service) payments.Settler {
		return settlement.NewQueue(s.jobs())
	})
	const batch, most, amount = 20, 200, 10
	a := s.signUp(most * amount)
	var ids []uuid.UUID
	keys := map[uuid.UUID]string{}
	settled := map[uuid.UUID]api.PaymentStatus{}
	var st processor.FakeStats
	for len(ids) < most && (st.Failed == 0 || st.Lost == 0) {
		var paid []uuid.UUID
		for range batch {
			key := fmt.Sprintf("settle-%d", len(ids))
			status, p := s.pay(a, key, amount)
			if status != http.StatusCreated {
				t.Fatalf("pay %s: %d", key, status)
			}
			if again, q := s.pay(a, key, amount); again != http.StatusCreated || q != p { // a replay inserts nothing
				t.Fatalf("replay %s: %d %+v, want %+v", key, again, q, p)
			}
			ids = append(ids, p.Id)
			paid = append(paid, p.Id)
			keys[p.Id] = key
		}
		// Settled, every call of the batch has reached the processor.
		maps.Copy(settled, s.waitSettled(a, paid))
		st = s.fake.Stats()
	}
	n := len(ids)
	if status, _ := s.pay(a, "too-much", 10_000); status != http.StatusPaymentRequired {
		t.Fatalf("a payment over the balance: %d, want 402", status)
	}

	charges := s.fake.Charges()
	if len(charges) != n {
		t.Fatalf("%d charges at the processor for %d payments: %+v", len(charges), n, charges)
	}
	for _, c := range charges {
		p, ok := settled[c.PaymentID]
		want := idem.CallKey{Scope: "account:" + a.Id.String(), Key: keys[c.PaymentID]}.Derive(settlement.Purpose(c.PaymentID))
		switch {
		case !ok:
			t.Errorf("charge %s for payment %s, which was not made", c.ID, c.PaymentID)
		case p.ProcessorId == nil || *p.ProcessorId != c.ID:
			t.Errorf("payment %s shows %v, the processor charged %s", c.PaymentID, p.ProcessorId, c.ID)
		case c.Key != want || c.AccountID != a.Id || c.Amount != amount || c.Currency != "USD":
			t.Errorf("charge %+v, want key %s, account %s, %d USD", c, want, a.Id, amount)
		}
	}
	st = s.fake.Stats()
	if st.Failed == 0 || st.Lost == 0 || st.Rejected != 0 {
		t.Fatalf("processor after %d payments %+v: want failures and lost answers, and no rejection", n, st)
	}
	var completed, other int
	err := s.pool.QueryRow(t.Context(), `select count(*) filter (where state = 'completed'), count(*) filter (where state <> 'completed')
		from river_job where kind = 'settle_payment'`).Scan(&completed, &other)
	if err != nil || completed != n || other != 0 {
		t.Fatalf("jobs: %d completed, %d not (%v); want %d and 0", completed, other, err, n)
	}
	t.Logf("%d payments, processor: %+v", n, st)
}

// TestQueueNeedsAKey: outside the work of an idem call there is no key to
// derive the processor's from, and Settle inserts nothing.
func TestQueueNeedsAKey(t *testing.T) {
	t.Parallel()
	pool := migrated(t)
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		return settlement.NewQueue(rc).Settle(t.Context(), tx, processor.Charge{PaymentID: uuid.New(), AccountID: uuid.New(), Amount: 1, Currency: "USD"})
	})
	if !errors.Is(err, idem.ErrNoKey) {
		t.Fatalf("Settle without a key: %v, want idem.ErrNoKey", err)
	}
}

// TestDirectChargesEveryAttempt shows what the demo's unprotected service
// does: each attempt gets a new key, so a charge whose answer was lost
// stays charged at the processor while its payment rolls back, and the
// retry is charged again. Not every lost answer reaches the service: Go's
// transport resends a request carrying an Idempotency-Key once, under the
// same key, when a reused connection dies before the answer, and the
// processor replays that charge. So payments go on until one is charged
// twice (each has at least a quarter's chance), 200 at most.
func TestDirectChargesEveryAttempt(t *testing.T) {
	t.Parallel()
	s := newService(t, processor.FakeConfig{LoseRate: 0.5, Seed: 3}, func(s *service) payments.Settler {
		return settlement.Direct{Processor: s.proc}
	})
	a := s.signUp(10_000)
	n := 0
	for ; n < 200 && len(s.fake.Charges()) <= n; n++ {
		key := fmt.Sprintf("direct-%d", n)
		for {
			status, _ := s.pay(a, key, 10)
			if status == http.StatusCreated {
				break
			}
			if status != http.StatusServiceUnavailable {
				t.Fatalf("pay: %d", status)
			}
		}
	}
	var committed int
	if err := s.pool.QueryRow(t.Context(), "select count(*) from payments where processor_id is not null").Scan(&committed); err != nil {
		t.Fatal(err)
	}
	if charges := len(s.fake.Charges()); committed != n || charges <= committed {
		t.Fatalf("%d payments settled, %d charges at the processor; want %d and more charges than payments", committed, charges, n)
	}
	t.Logf("%d payments, %d charges", n, len(s.fake.Charges()))
}
