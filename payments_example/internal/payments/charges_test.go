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
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/idemriver"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/settlement"
	"github.com/idemhq/idem/payments_example/processor"
)

// liveness bounds the waits for the completer: not a timing assertion,
// only a limit on a broken run. River's scheduler makes a scheduled job
// available up to 5 s after its time.
const liveness = 60 * time.Second

// The charges' lease and their completer jobs' delay: short, so that the
// tests wait mostly for River's scheduler (up to 5 s), yet long enough that
// the processor call (its timeout is half the lease) finishes on a loaded
// machine.
const (
	chargeLease    = 2 * time.Second
	completerAfter = 2500 * time.Millisecond
)

// chargeEnv is the service as the command wires it with a processor:
// POST /charges on the settlement River client, which runs the charges'
// completer.
type chargeEnv struct {
	*env
	keys *idem.Client
	fake *processor.Fake
	jobs *river.Client[pgx.Tx]
}

// newChargeEnv starts the service with a processor that processorHandler
// makes of the fake (nil: the fake as it is).
func newChargeEnv(t *testing.T, processorHandler func(*processor.Fake) http.Handler) *chargeEnv {
	t.Helper()
	fake, err := processor.NewFake(processor.FakeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = fake
	if processorHandler != nil {
		h = processorHandler(fake)
	}
	procSrv := httptest.NewServer(h)
	t.Cleanup(procSrv.Close)
	proc, err := processor.NewClient(procSrv.URL, procSrv.Client())
	if err != nil {
		t.Fatal(err)
	}
	ce := &chargeEnv{fake: fake}
	ce.env = setup(t, func(t testing.TB, pool *pgxpool.Pool) http.Handler {
		if err := settlement.Migrate(t.Context(), pool); err != nil {
			t.Fatal(err)
		}
		if ce.keys, err = idem.NewClient(pool, nil); err != nil {
			t.Fatal(err)
		}
		workers := river.NewWorkers()
		if ce.jobs, err = settlement.NewClient(pool, proc, nil, workers); err != nil {
			t.Fatal(err)
		}
		charges, err := payments.NewCharges(ce.keys, proc, &payments.ChargesConfig{
			Lease: chargeLease, OnStart: idemriver.OnStart(ce.jobs, completerAfter),
		})
		if err != nil {
			t.Fatal(err)
		}
		completer, err := idemriver.NewWorker(charges)
		if err != nil {
			t.Fatal(err)
		}
		river.AddWorker(workers, completer)
		if err := ce.jobs.Start(context.WithoutCancel(t.Context())); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), liveness)
			defer cancel()
			if err := ce.jobs.Stop(ctx); err != nil {
				t.Error(err)
			}
		})
		h, err := payments.NewHandler(pool, ce.keys, &payments.Config{Charges: charges, PaymentRate: rate.Inf})
		if err != nil {
			t.Fatal(err)
		}
		return h
	})
	return ce
}

func (e *env) charge(auth, key string, amount int64) response {
	e.t.Helper()
	return e.send(request{method: "POST", path: "/charges", auth: auth, key: key, body: fmt.Sprintf(`{"amount": %d, "currency": "USD"}`, amount)})
}

// wantRefused checks a stored refusal of POST /charges: 402, its code.
func wantRefused(t *testing.T, res response, code string, replayed bool) {
	t.Helper()
	wantProblem(t, res, http.StatusPaymentRequired, idemhttp.ProblemRefused)
	var p struct{ Code string }
	decodeInto(t, res, &p)
	if p.Code != code || res.replayed() != replayed {
		t.Fatalf("refusal %s (replayed %v), want code %q, replayed %v", res.body, res.replayed(), code, replayed)
	}
}

// TestCharges: a charge is answered with the processor's charge, once,
// and replayed; GET /payments/{id} shows it settled; a refusal is stored
// and moves no money; a body that is not valid is not stored; a service
// without a processor answers 501.
func TestCharges(t *testing.T) {
	t.Parallel()
	e := newChargeEnv(t, nil)
	a := e.signUp("ada", 10_000)

	t.Run("charged and replayed", func(t *testing.T) {
		first := e.charge(a.ApiKey, "c-1", 2500)
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		var c api.Charge
		decodeInto(t, first, &c)
		again := e.charge(a.ApiKey, "c-1", 2500)
		if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(bytes.TrimSpace(again.body), bytes.TrimSpace(first.body)) {
			t.Fatalf("replay: %d replayed=%v %s; want %s", again.status, again.replayed(), again.body, first.body)
		}
		charges := e.fake.Charges()
		if len(charges) != 1 || charges[0].ID != c.ProcessorId || charges[0].PaymentID != c.Id || c.Balance != 7500 || e.balance(a.Id) != 7500 {
			t.Fatalf("charge %+v, processor %+v, balance %d; want one charge of 25.00 matching the answer", c, charges, e.balance(a.Id))
		}
		got := e.send(request{method: "GET", path: "/payments/" + c.Id.String(), auth: a.ApiKey})
		var st api.PaymentStatus
		decodeInto(t, got, &st)
		if got.status != http.StatusOK || !st.Settled || st.ProcessorId == nil || *st.ProcessorId != c.ProcessorId {
			t.Fatalf("GET /payments/%s: %d %s; want settled by %s", c.Id, got.status, got.body, c.ProcessorId)
		}
		if res := e.charge(a.ApiKey, "c-1", 2600); res.status != http.StatusUnprocessableEntity {
			t.Fatalf("another amount under the key: %d %s; want 422", res.status, res.body)
		}
	})

	t.Run("insufficient funds", func(t *testing.T) {
		before := e.balance(a.Id)
		wantRefused(t, e.charge(a.ApiKey, "c-2", 1_000_000), payments.RefusalInsufficientFunds, false)
		wantRefused(t, e.charge(a.ApiKey, "c-2", 1_000_000), payments.RefusalInsufficientFunds, true)
		if e.balance(a.Id) != before || e.payments(a.Id) != 1 || len(e.fake.Charges()) != 1 {
			t.Fatalf("balance %d (was %d), payments %d, processor charges %d; want nothing moved", e.balance(a.Id), before, e.payments(a.Id), len(e.fake.Charges()))
		}
	})

	t.Run("invalid body not stored", func(t *testing.T) {
		bad := e.send(request{method: "POST", path: "/charges", auth: a.ApiKey, key: "c-3", body: `{"amount": 0, "currency": "USD"}`, invalid: true})
		wantProblem(t, bad, http.StatusBadRequest, idemhttp.ProblemInvalidRequest)
		if res := e.charge(a.ApiKey, "c-3", 100); res.status != http.StatusCreated || res.replayed() {
			t.Fatalf("the corrected charge under the same key: %d %s", res.status, res.body)
		}
	})

	t.Run("without a processor", func(t *testing.T) {
		plain := setup(t, protected)
		b := plain.signUp("bob", 10_000)
		wantProblem(t, plain.charge(b.ApiKey, "c-4", 100), http.StatusNotImplemented, "about:blank")
	})
}

// A processor that refuses the charge itself: the amount goes back, the
// payment is deleted, and the refusal is stored.
func TestChargeDeclined(t *testing.T) {
	t.Parallel()
	e := newChargeEnv(t, func(*processor.Fake) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "card declined", http.StatusBadRequest) })
	})
	a := e.signUp("ada", 10_000)
	wantRefused(t, e.charge(a.ApiKey, "d-1", 2500), payments.RefusalChargeDeclined, false)
	wantRefused(t, e.charge(a.ApiKey, "d-1", 2500), payments.RefusalChargeDeclined, true)
	if e.balance(a.Id) != 10_000 || e.payments(a.Id) != 0 {
		t.Fatalf("balance %d, payments %d; want the amount back and no payment", e.balance(a.Id), e.payments(a.Id))
	}
}

// giveUpProcessor stands in front of the fake and makes clients give up at
// a known point of their charge: the first call for a charge whose amount
// is in before is held before the fake acts, one in after once the fake
// has charged (its answer is then lost); each tells its client, by
// closing the charge's channel, to give up, and waits for the service to
// abandon the call. Later calls (the completer's) go straight through.
type giveUpProcessor struct {
	fake          *processor.Fake
	before, after map[int64]chan struct{}
	mu            sync.Mutex
	seen          map[int64]bool
}

func (g *giveUpProcessor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "unreadable", http.StatusBadRequest)
		return
	}
	var c processor.Charge
	_ = json.Unmarshal(body, &c)
	g.mu.Lock()
	first := !g.seen[c.Amount]
	g.seen[c.Amount] = true
	g.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if gone, ok := g.before[c.Amount]; ok && first {
		close(gone)
		<-r.Context().Done()
		return
	}
	if gone, ok := g.after[c.Amount]; ok && first {
		g.fake.ServeHTTP(httptest.NewRecorder(), r) // charged; the answer goes nowhere
		close(gone)
		<-r.Context().Done()
		return
	}
	g.fake.ServeHTTP(w, r)
}

// TestChargesFinishedWhenClientsGiveUp: of twelve charges, four clients
// wait for their answer, four give up while the processor is being asked
// (before it acted) and four once it has charged (its answer lost). None
// of the eight comes back; the completer finishes them all: every charge
// is finished and settled, the processor charged each payment exactly
// once (no duplicate), the balance is exact, and nothing is left
// unfinished.
func TestChargesFinishedWhenClientsGiveUp(t *testing.T) {
	t.Parallel()
	g := &giveUpProcessor{before: map[int64]chan struct{}{}, after: map[int64]chan struct{}{}, seen: map[int64]bool{}}
	const n = 12
	for i := range int64(n) {
		switch i % 3 {
		case 1:
			g.before[100+i] = make(chan struct{})
		case 2:
			g.after[100+i] = make(chan struct{})
		}
	}
	e := newChargeEnv(t, func(f *processor.Fake) http.Handler { g.fake = f; return g })
	a := e.signUp("ada", 100_000)

	var wg sync.WaitGroup
	gaveUp := map[string]bool{}
	var total int64
	for i := range int64(n) {
		amount, key := 100+i, fmt.Sprintf("g-%d", i)
		total += amount
		gone := g.before[amount]
		if gone == nil {
			gone = g.after[amount]
		}
		if gone == nil {
			wg.Go(func() {
				if res := e.charge(a.ApiKey, key, amount); res.status != http.StatusCreated {
					t.Errorf("charge %s: %d %s", key, res.status, res.body)
				}
			})
			continue
		}
		gaveUp[key] = true
		wg.Go(func() {
			ctx, cancel := context.WithCancel(t.Context())
			go func() { <-gone; cancel() }()
			req, err := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/charges",
				bytes.NewReader(fmt.Appendf(nil, `{"amount": %d, "currency": "USD"}`, amount)))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+a.ApiKey)
			req.Header.Set(idemhttp.HeaderKey, key)
			res, err := e.client.Do(req)
			if err == nil {
				_ = res.Body.Close()
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("the client that gave up on %s got %v; want context.Canceled", key, err)
			}
		})
	}
	wg.Wait()

	deadline := time.Now().Add(liveness)
	for {
		st, err := e.keys.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if st.Unfinished == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d charges still unfinished after %v", st.Unfinished, liveness)
		}
		time.Sleep(50 * time.Millisecond)
	}

	scope := "account:" + a.Id.String()
	for i := range n {
		key := fmt.Sprintf("g-%d", i)
		rec, err := e.keys.Lookup(t.Context(), scope, key)
		if err != nil || rec.Status != idem.StatusCompleted {
			t.Fatalf("charge %s: %+v, %v; want finished", key, rec, err)
		}
	}
	var rows, settled int
	if err := e.pool.QueryRow(t.Context(), "select count(*), count(processor_id) from payments where account_id = $1", a.Id).Scan(&rows, &settled); err != nil {
		t.Fatal(err)
	}
	perPayment := map[uuid.UUID]int{}
	for _, c := range e.fake.Charges() {
		perPayment[c.PaymentID]++
	}
	if rows != n || settled != n || len(perPayment) != n {
		t.Fatalf("%d payments, %d settled, %d charged at the processor; want %d each", rows, settled, len(perPayment), n)
	}
	for id, k := range perPayment {
		if k != 1 {
			t.Fatalf("payment %s charged %d times at the processor", id, k)
		}
	}
	if got, want := e.balance(a.Id), int64(100_000)-total; got != want {
		t.Fatalf("balance %d, want %d", got, want)
	}
	// The eight that gave up were finished by the completer, the four
	// others by their clients: every job ends, and says which.
	var jobs []*rivertype.JobRow
	for {
		res, err := e.jobs.JobList(t.Context(), river.NewJobListParams().Kinds(idemriver.CompleteArgs{}.Kind()).States(rivertype.JobStateCompleted).First(100))
		if err != nil {
			t.Fatal(err)
		}
		if jobs = res.Jobs; len(jobs) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d completer jobs completed after %v, want %d", len(jobs), liveness, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	byCompleter := 0
	for _, j := range jobs {
		var out idemriver.Result
		if err := json.Unmarshal(j.Output(), &out); err != nil {
			t.Fatal(err)
		}
		var args idemriver.CompleteArgs
		if err := json.Unmarshal(j.EncodedArgs, &args); err != nil {
			t.Fatal(err)
		}
		if (out.Outcome == "executed") != gaveUp[args.Key] {
			t.Errorf("the completer job of %s: %s; its client gave up: %v", args.Key, out.Outcome, gaveUp[args.Key])
		}
		if out.Outcome == "executed" {
			byCompleter++
		}
	}
	if byCompleter != len(gaveUp) {
		t.Fatalf("%d charges finished by the completer, want %d", byCompleter, len(gaveUp))
	}
}
