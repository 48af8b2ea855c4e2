package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The crash test of the payments example (-payments): the same run (faults,
// retrying clients, fault figures) drives the example's own binary, built
// from payments_example (a module of its own, which this one does not
// import) by scripts/crashtest.sh.
//
// The run signs up -accounts accounts (principals) before the clients
// start; client c pays from account c mod -accounts with that account's
// API key as its Bearer token, so clients share accounts and every
// account's charges contend on its row. Every account opens with the
// service's fixed opening balance, which the run then sets in the
// database, before any payment, to what the run needs: for the first
// account a quarter of what its clients will ask for, so that many of its
// payments are refused (402, a stored answer); for every other account
// all of it. The service is started without a payment rate limit worth
// the name (-payment-rate, -payment-burst): a 429 would fail the run.
// Keys are spelt the same on several accounts (client c's keys are those
// of every client in the same position on another account), so that a
// service that did not scope keys by principal would answer 422 or replay
// another account's payment.
//
// With -processor the payments service settles every payment at a fake
// processor (payments_example/cmd/processor, which fails and loses a share
// of its calls); the processor outlives every fault, as an external
// system would.

// payAmountOf is the amount, in cents, of a payment key: 1 to 10,000.
func payAmountOf(key string) int64 { return amountOf(key)%10_000 + 1 }

// payAccount is one principal of a payments run.
type payAccount struct {
	id     uuid.UUID // random (version 4), the service's
	apiKey string
	start  int64 // opening balance
	low    bool  // opened with too little for its payments: many are refused
}

func (a payAccount) scope() string { return "account:" + a.id.String() }

// payment is the body of a 201 answer of POST /payments.
type payment struct {
	ID        uuid.UUID `json:"id"`
	AccountID uuid.UUID `json:"account_id"`
	Amount    int64     `json:"amount"`
	Balance   int64     `json:"balance"` // right after this charge
}

// problemInsufficientFunds is the type of the payments service's 402.
const problemInsufficientFunds = "/problems/payments/insufficient-funds"

// fakeCharge and fakeStats are the fake processor's GET /charges.
type fakeCharge struct {
	ID        string    `json:"id"`
	Key       string    `json:"idempotency_key"`
	PaymentID uuid.UUID `json:"payment_id"`
	AccountID uuid.UUID `json:"account_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Calls     int       `json:"calls"`
}

type fakeStats struct {
	Calls    int `json:"calls"`
	Charges  int `json:"charges"`
	Replays  int `json:"replays"`
	Failed   int `json:"failed"`
	Lost     int `json:"lost"`
	Rejected int `json:"rejected"`
}

// paymentsService is the payments example as a crashService.
type paymentsService struct {
	bin       string // the payments service's binary
	p         plan
	accounts  int
	opTimeout time.Duration
	logDir    string // the processes' logs

	// settlement, when procURL is set
	procURL       string
	settleTimeout time.Duration

	principals []payAccount // principal n is principals[n-1]

	// What finish found.
	replays    map[opKey]opResult // the last replay of every answered key
	replayTook time.Duration      // how long sending every key again took
	lastAnswer time.Time
	settled    time.Duration // from the last answer until every payment was settled
	settleErr  error
	charges    []fakeCharge
	procStats  fakeStats
}

func (s *paymentsService) describe() string {
	d := fmt.Sprintf("the payments service (%s), %d accounts", s.bin, s.accounts)
	if s.procURL != "" {
		d += ", settling at a fake processor"
	}
	return d
}

// businessSQL is empty: the service creates its tables (River's included)
// when it starts.
func (s *paymentsService) businessSQL() string { return "" }

// freePort returns a loopback address no one listens on now.
func freePort() (string, error) {
	ln, err := new(net.ListenConfig).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// launch starts the payments service on addr (a free port the first time)
// and waits until GET /healthz answers 200: the service answers it once it
// has created its tables and reaches the database. The service serves no
// metrics (-metrics-addr empty): the run reads none, and the applications
// would otherwise all listen on the same default address. Its per-account
// payment rate limit is set far above what the clients send.
func (s *paymentsService) launch(dbURL, addr string) (*process, string, error) {
	if addr == "" {
		var err error
		if addr, err = freePort(); err != nil {
			return nil, "", err
		}
	}
	args := []string{"-addr", addr, "-metrics-addr=", "-payment-rate", unlimitedRate, "-payment-burst", unlimitedRate}
	if s.procURL != "" {
		args = append(args, "-processor", s.procURL)
	}
	// The service lives until it is killed or the run ends; no context of
	// the caller's governs it.
	cmd := exec.CommandContext(context.Background(), s.bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "PROCESSOR_URL=", "METRICS_ADDR=")
	return startLogged(cmd, filepath.Join(s.logDir, "payments-"+strings.ReplaceAll(addr, ":", "-")+".log"),
		addr, "http://"+addr+"/healthz")
}

// unlimitedRate is the payments service's -payment-rate and
// -payment-burst in a run: payments per second and account, far more than
// the clients send, so that no payment is answered 429.
const unlimitedRate = "1000000"

// startLogged starts cmd with its output appended to logPath and waits
// until GET ready answers 200, for at most two minutes (a service that
// starts while the database recovers waits for it).
func startLogged(cmd *exec.Cmd, logPath, addr, ready string) (*process, string, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, "", err
	}
	cmd.Stdout, cmd.Stderr = log, log
	proc, err := startProcess(cmd)
	_ = log.Close() // the child has its own copy
	if err != nil {
		return nil, "", err
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-proc.done:
			return nil, "", fmt.Errorf("%s exited while starting (%v); its log: %s", filepath.Base(cmd.Path), cmd.ProcessState, logPath)
		default:
		}
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, ready, nil)
		if err != nil {
			proc.kill()
			return nil, "", err
		}
		if res, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return proc, addr, nil
			}
		}
		if time.Now().After(deadline) {
			proc.kill()
			return nil, "", fmt.Errorf("%s did not answer %s with 200 within two minutes; its log: %s", filepath.Base(cmd.Path), ready, logPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startProcessor starts the fake processor at bin on a free port, failing
// and losing the given shares of its calls, and returns it and its URL.
func startProcessor(bin, logDir string, fail, lose float64, seed uint64) (*process, string, error) {
	addr, err := freePort()
	if err != nil {
		return nil, "", err
	}
	cmd := exec.CommandContext(context.Background(), bin, "-addr", addr,
		"-fail", fmt.Sprint(fail), "-lose", fmt.Sprint(lose), "-seed", fmt.Sprint(seed))
	proc, _, err := startLogged(cmd, filepath.Join(logDir, "processor.log"), addr, "http://"+addr+"/charges")
	if err != nil {
		return nil, "", err
	}
	return proc, "http://" + addr, nil
}

// freshKey: client c pays from principal c mod accounts + 1; its keys are
// spelt like those of the clients in the same position on the other
// accounts.
func (s *paymentsService) freshKey(c, i int) opKey {
	return opKey{principal: c%s.accounts + 1, key: fmt.Sprintf("s%d-p%d-%d", s.p.seed, c/s.accounts, i)}
}

// openingBalances is each principal's opening balance: what its clients'
// new keys ask for, plus 1,000,000 so that nothing is refused, except for
// principal 1, which gets a quarter of it.
func (s *paymentsService) openingBalances() []payAccount {
	spend := make([]int64, s.accounts)
	for c := range s.p.clients {
		for _, op := range crashSchedule(s.p, c, s.freshKey) {
			if op.class == classFresh {
				spend[op.principal-1] += payAmountOf(op.key)
			}
		}
	}
	out := make([]payAccount, s.accounts)
	for i := range out {
		out[i].start = spend[i] + 1_000_000
	}
	out[0] = payAccount{start: spend[0] / 4, low: true}
	return out
}

// prepare signs up the accounts, through the first application, and sets
// each one's opening balance in the database (the service opens every
// account with the same one). Sign-up is not idempotent (its answer holds
// a secret), so it runs before any fault, and any failure ends the run.
func (s *paymentsService) prepare(ctx context.Context, a *apps) error {
	s.principals = s.openingBalances()
	conn, err := pgx.Connect(ctx, a.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	hc := &http.Client{Timeout: 30 * time.Second}
	for i := range s.principals {
		acc := &s.principals[i]
		body := fmt.Appendf(nil, `{"owner": "crash test %d"}`, i+1)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a.addr(0)+"/accounts", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("sign up: %w", err)
		}
		data, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if err != nil {
			return fmt.Errorf("sign up: %w", err)
		}
		var created struct {
			ID      uuid.UUID `json:"id"`
			APIKey  string    `json:"api_key"`
			Balance int64     `json:"balance"`
		}
		if res.StatusCode != http.StatusCreated || json.Unmarshal(data, &created) != nil ||
			created.ID == uuid.Nil || created.APIKey == "" {
			return fmt.Errorf("sign up: %d %s", res.StatusCode, bytes.TrimSpace(data))
		}
		acc.id, acc.apiKey = created.ID, created.APIKey
		// Only if the balance is still the one sign-up answered: nothing
		// has paid from the account yet.
		tag, err := conn.Exec(ctx, "UPDATE accounts SET balance = $3 WHERE id = $1 AND balance = $2", acc.id, created.Balance, acc.start)
		if err != nil {
			return fmt.Errorf("set the opening balance of account %s: %w", acc.id, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("set the opening balance of account %s: no account %s with balance %d", acc.id, acc.id, created.Balance)
		}
	}
	return nil
}

func (s *paymentsService) request(ctx context.Context, addr string, k opKey) (*http.Request, error) {
	acc := s.principals[k.principal-1]
	body := fmt.Appendf(nil, `{"account_id": %q, "amount": %d, "currency": "USD"}`, acc.id.String(), payAmountOf(k.key))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/payments", unrewindable(body))
	if err != nil {
		return nil, err
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+acc.apiKey)
	req.Header.Set("Idempotency-Key", k.key)
	return req, nil
}

// final: a payment made (201) and a payment refused for insufficient
// funds (402) are both stored answers.
func (s *paymentsService) final(status int) bool {
	return status == http.StatusCreated || status == http.StatusPaymentRequired
}

// finish sends every answered key once more, now that nothing fails, and
// keeps the answers: each must replay what its client got. With a
// processor it then waits until every payment is settled and reads the
// processor's charges.
func (s *paymentsService) finish(ctx context.Context, dbURL string, a *apps, results [][]opResult) {
	var keys []opKey
	seen := map[opKey]bool{}
	for _, rs := range results {
		for _, r := range rs {
			if r.err == "" {
				s.lastAnswer = maxTime(s.lastAnswer, r.end)
				if !seen[r.opKey] {
					seen[r.opKey] = true
					keys = append(keys, r.opKey)
				}
			}
		}
	}
	hc := crashHTTPClient(s.p.clients)
	next := make(chan opKey)
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	s.replays = make(map[opKey]opResult, len(keys))
	began := time.Now()
	for c := range s.p.clients {
		wg.Go(func() {
			for k := range next {
				r := sendOp(ctx, hc, a, s.opTimeout, c, "last replay", k)
				mu.Lock()
				s.replays[k] = r
				mu.Unlock()
			}
		})
	}
	for _, k := range keys {
		next <- k
	}
	close(next)
	wg.Wait()
	s.replayTook = time.Since(began)

	if s.procURL == "" {
		return
	}
	s.settleErr = waitSettled(ctx, dbURL, s.lastAnswer.Add(s.settleTimeout))
	s.settled = time.Since(s.lastAnswer)
	if err := s.readProcessor(ctx); err != nil {
		s.settleErr = errors.Join(s.settleErr, err)
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// waitSettled polls the database until every payment has its processor
// charge and every settlement job is completed, or deadline passes.
func waitSettled(ctx context.Context, dbURL string, deadline time.Time) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var unsettled, pending int
		err := conn.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM payments WHERE processor_id IS NULL),
			(SELECT count(*) FROM river_job WHERE kind = 'settle_payment' AND state <> 'completed')`).Scan(&unsettled, &pending)
		if err != nil {
			return err
		}
		if unsettled == 0 && pending == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d payments not settled and %d settlement jobs not completed at the deadline", unsettled, pending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// readProcessor reads the fake processor's statistics and charges.
func (s *paymentsService) readProcessor(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.procURL+"/charges", nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("read the processor's charges: %w", err)
	}
	defer res.Body.Close()
	var state struct {
		Stats   fakeStats    `json:"stats"`
		Charges []fakeCharge `json:"charges"`
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("read the processor's charges: status %d", res.StatusCode)
	}
	if err := json.NewDecoder(res.Body).Decode(&state); err != nil {
		return fmt.Errorf("read the processor's charges: %w", err)
	}
	s.procStats, s.charges = state.Stats, state.Charges
	return nil
}

func (s *paymentsService) reconcile(ctx context.Context, dbURL string, results [][]opResult, fig *crashFigures) error {
	return reconcilePayments(ctx, dbURL, s, results, fig)
}

// sortedIDs returns m's keys in order (of their bytes, which is that of
// their text), so that what is reported about them comes in the same order
// every time.
func sortedIDs[V any](m map[uuid.UUID]V) []uuid.UUID {
	ids := make([]uuid.UUID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return ids
}

// runPaymentsCrash runs the crash test of the payments service s, with the
// fake processor at processorBin when it is not "". The processes' logs go
// to a directory that is removed after a run without violations.
func runPaymentsCrash(p plan, cp crashPlan, s *paymentsService, processorBin string, fail, lose float64, keep bool) int {
	dir, err := os.MkdirTemp("", "idem-crash-payments-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-load:", err)
		return 1
	}
	s.logDir = dir
	code := func() int {
		if processorBin != "" {
			proc, url, err := startProcessor(processorBin, dir, fail, lose, p.seed)
			if err != nil {
				fmt.Fprintln(os.Stderr, "idem-load: processor:", err)
				return 1
			}
			defer proc.stop()
			s.procURL = url
		}
		return runCrash(p, cp, s, keep)
	}()
	if code == 0 && !keep {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "idem-load: the services' logs are in %s\n", dir)
	}
	return code
}
