// Command demo shows, in about a minute, what idem guarantees.
//
// It builds the payments service and runs it as a child process against a
// fake payment processor (package processor) that fails 10% of its calls
// and loses 20% of its answers after charging. It signs up for an account
// and its API key, puts a proxy in front of the service that loses 30% of
// the answers after the service has acted, and sends 300 payments through
// it; halfway through, it kills the service (SIGKILL) and starts it
// again. The client is the one generated from the service's OpenAPI spec
// (package api), over idemclient's retrying transport, which retries what
// may not have gone through with the payment's Idempotency-Key: spec,
// server and client, exactly once. Then it waits until every payment is settled at the
// processor and checks the account and the processor: with idem, the
// balance is exact and the processor charged each payment once. It then
// sends the same traffic, through the same lossy network and with the same
// kill, to the same business code without idem (./unprotected), which
// calls the processor inside the request with a new key per attempt, and
// shows how much money the retries charged twice, in the service and at
// the processor.
//
// The service with idem also takes, at the same time, through the same
// lossy network and the same kill, 100 synchronous charges (POST /charges)
// from another account: an idem.Operation that takes the amount, calls the
// processor (which takes 400 ms) with no transaction open, and records its
// charge, before it answers. A fifth of those clients give up after
// 150 ms, while the service waits for the processor, and never come back;
// the service's completer (package idemriver, on its River client)
// finishes their charges. The demo waits until no charge is unfinished and
// checks that every charge that began was finished and charged at the
// processor exactly once.
//
// Both services also consume, through the same kill, 200 deposits for an
// account of their own from a NATS JetStream stream (internal/deposits),
// on a NATS server embedded in the demo's process: the service with idem
// credits each in the transaction of its key (its Nats-Msg-Id), through
// idemconsume and idemnats; the unprotected one credits each delivery in
// a plain transaction and acknowledges it after COMMIT. The deposits come
// in ten batches, keeping pace with the payments, and the kill waits until
// the service holds some it has not acknowledged, which the stream
// delivers again. The producer publishes about a tenth of them a second
// time, with the same Nats-Msg-Id, later than the stream's duplicate
// window (a second here, two minutes by default), as an outbox replayed
// after a restart would. The ledger has no unique constraint on the
// event's id: the demo counts the credits of each deposit and checks the
// balance.
//
// Last, it prints what the service with idem counted itself,
// read from its GET /metrics (on its internal listener) before it was
// stopped: idem_calls_total by outcome and HTTP status since its restart,
// its deposits consumer's deliveries by result, and whether its replays
// are the replays the proxies relayed from it and the duplicate deposits
// its consumer dropped.
//
// Run it with `make demo` or `cd payments_example && go run ./demo`. It
// finds PostgreSQL as the tests do (IDEM_TEST_DATABASE_URL, DATABASE_URL,
// else 127.0.0.1:5432), works in a database of its own that it drops at
// the end, needs no NATS server of the machine's, and exits non-zero if,
// with idem, the balance is not exact, a payment is not settled exactly
// once within a minute of the last answer, a charge is unfinished,
// duplicated or not charged exactly once a minute after the last answer,
// a deposit is credited twice or not at all or the stream still holds
// one a minute after the last publish, or the service's metrics count
// other replays than the proxies relayed and its consumer dropped.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/callmetrics"
	"github.com/idemhq/idem/payments_example/internal/deposits"
	"github.com/idemhq/idem/payments_example/internal/freeport"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/settlement"
	"github.com/idemhq/idem/payments_example/processor"
)

const (
	paymentCount   = 300
	workers        = 8
	lossRate       = 0.30
	seed           = 2026                    // fixes the keys, the amounts and which answers are lost
	openingBalance = payments.OpeningBalance // every account's: 100,000.00 USD, enough for every charge twice over
	processorFail  = 0.10                    // the processor's calls answered 503 before charging
	processorLose  = 0.20                    // the processor's answers lost after charging
	killAt         = 0.5                     // the service is killed once this share of the payments is answered
	settleBound    = 60 * time.Second
	timeLimit      = 4 * time.Minute
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeLimit)
	defer cancel()

	with, _, _, err := run(ctx, os.Stdout, makePlan(), makeChargePlan(), makeDepositPlan(), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	if !with.exact() || !with.sync.exact() || !with.deposits.exact() || !with.metricsAgree() {
		os.Exit(1)
	}
}

// run plays both halves of the demo with plan and the deposits of
// depositPlan, and the charges of charges with the service with idem,
// then plan once more against the service with idem from a naive client
// (go-retryablehttp's defaults, a new key per attempt), reports them on
// out and returns them. wrap, if not nil, wraps the transport of every
// request the demo sends to the service (the tests check them against the
// spec).
func run(ctx context.Context, out io.Writer, plan []payment, charges []charge, depositPlan []deposit, wrap func(http.RoundTripper) http.RoundTripper) (with, without, naive outcome, err error) {
	pool, cleanup, err := freshDatabase(ctx, serverURL())
	if err != nil {
		return with, without, naive, err
	}
	defer cleanup()
	if err := payments.Migrate(ctx, pool); err != nil {
		return with, without, naive, err
	}
	if err := deposits.Migrate(ctx, pool); err != nil {
		return with, without, naive, err
	}
	if err := settlement.Migrate(ctx, pool); err != nil {
		return with, without, naive, err
	}
	dir, err := os.MkdirTemp("", "idem-demo-")
	if err != nil {
		return with, without, naive, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(out, "Building the service (go build)...")
	bins, err := build(ctx, dir, serviceCmd, unprotectedCmd)
	if err != nil {
		return with, without, naive, err
	}

	fmt.Fprintf(out, "Sending %d payments (%d workers) through a network that loses %.0f%% of the\n"+
		"answers after the service has acted. Every failure is retried with the same key.\n"+
		"The service settles each payment at a processor that fails %.0f%% of its calls and\n"+
		"loses %.0f%% of its answers, and is killed (SIGKILL) and restarted once, halfway.\n"+
		"Meanwhile the service with idem takes %d synchronous charges (POST /charges) from\n"+
		"another account, through the same network and the same kill; %.0f%% of their\n"+
		"clients give up after %v, while the processor (%v) is being asked.\n"+
		"And each service consumes %d deposits for an account of their own from a NATS\n"+
		"JetStream stream, in %d batches, through the same kill; %d of them are published\n"+
		"a second time with the same Nats-Msg-Id, later than the stream's duplicate window.\n\n",
		len(plan), workers, lossRate*100, processorFail*100, processorLose*100,
		len(charges), giveUpShare*100, giveUpAfter, processorLatency,
		len(depositPlan), depositBatches, retriedCount(depositPlan))

	h := half{pool: pool, dbURL: pool.Config().ConnString(), dir: dir, plan: plan, charges: charges, deposits: depositPlan, wrap: wrap}
	if with, err = h.play(ctx, bins[0], true); err != nil {
		return with, without, naive, fmt.Errorf("with idem: %w", err)
	}
	if without, err = h.play(ctx, bins[1], false); err != nil {
		return with, without, naive, fmt.Errorf("without idem: %w", err)
	}
	naiveHalf := h
	naiveHalf.naive = true
	if naive, err = naiveHalf.play(ctx, bins[0], true); err != nil {
		return with, without, naive, fmt.Errorf("naive client: %w", err)
	}
	report(out, with, without)
	reportNaive(out, with, naive)
	return with, without, naive, nil
}

// makePlan returns the payments to send. A real client calls uuid.New()
// for each key; the demo draws its keys and amounts from the seed so that
// every run prints the same numbers.
func makePlan() []payment {
	rng := rand.New(rand.NewPCG(seed, seed))
	var keySeed [32]byte
	binary.LittleEndian.PutUint64(keySeed[:], seed)
	keys := rand.NewChaCha8(keySeed)
	plan := make([]payment, paymentCount)
	for i := range plan {
		key, err := uuid.NewRandomFromReader(keys)
		if err != nil {
			panic(err) // ChaCha8 never fails to read
		}
		plan[i] = payment{key: key.String(), amount: 100 + rng.Int64N(9_901)} // 1.00 to 100.00 USD
	}
	return plan
}

// outcome is what one half of the demo measured.
type outcome struct {
	sent     int
	failed   []error // payments never answered 201
	lost     int64   // answers the proxy dropped
	retries  int64   // requests the client sent again
	replays  int64   // answers served from a stored result
	kills    int     // SIGKILLs of the service
	charges  int     // payment rows committed
	expected int64   // opening balance minus the payments answered 201
	actual   int64   // the balance the service reports

	processed int           // charges the processor made for the account
	settled   int           // payment rows settled by a processor charge
	settling  time.Duration // from the last answer until every payment was settled

	// With idem: the restarted service's idem_calls_total (GET /metrics)
	// and the replays the proxy relayed from it.
	metrics             []callmetrics.Count
	replaysSinceRestart int64

	// With idem: the synchronous charges (POST /charges).
	sync chargeOutcome
	// The deposits consumed from the stream.
	deposits depositOutcome
}

func (o outcome) duplicates() int { return o.charges - (o.sent - len(o.failed)) }

// processorDuplicates counts the processor's charges beyond one per
// payment the client made.
func (o outcome) processorDuplicates() int { return o.processed - (o.sent - len(o.failed)) }

func (o outcome) exact() bool {
	return len(o.failed) == 0 && o.duplicates() == 0 && o.actual == o.expected &&
		o.processorDuplicates() == 0 && o.settled == o.charges && o.settling <= settleBound
}

// metricsAgree reports whether the restarted service counted as many
// replays in its metrics as the proxies relayed from it, the payments' and
// the charges', and its deposits consumer counted as duplicates.
func (o outcome) metricsAgree() bool {
	return callmetrics.Of(o.metrics, "replayed") == o.replaysSinceRestart+o.sync.replaysSinceRestart+o.deposits.counted["duplicate"]
}

// half is what both halves of the demo share.
type half struct {
	pool  *pgxpool.Pool
	dbURL string
	dir   string // for the services' logs
	plan  []payment
	// charges are sent to the service with idem, alongside plan.
	charges []charge
	// deposits are published to a stream that the service consumes,
	// alongside plan.
	deposits []deposit
	wrap     func(http.RoundTripper) http.RoundTripper
	// naive sends the payments through newNaiveClient, and nothing else:
	// no charges, no deposits, no wait for settlement, no metrics.
	naive bool
}

// play runs the service bin as a child process against a fake processor,
// behind a lossy proxy, opens an account and sends the plan through the
// proxy, killing and restarting the service once on the way. Unless
// naive, the deposits are published meanwhile to a NATS server of the
// half's own, which the service consumes, and play waits until none is
// pending (up to settleBound after the last publish) before it counts
// their credits. With async (the service with idem), settlement happens
// after the answers, and play waits for it (up to settleBound after the
// last answer); and the charges go through a proxy of their own at the
// same time, and play waits until none is unfinished.
func (h half) play(ctx context.Context, bin string, async bool) (outcome, error) {
	fake, err := processor.NewFake(processor.FakeConfig{FailRate: processorFail, LoseRate: processorLose, Seed: seed})
	if err != nil {
		return outcome{}, err
	}
	slow := &slowProcessor{next: fake}
	processorURL, stopProcessor, err := serve(ctx, slow)
	if err != nil {
		return outcome{}, err
	}
	defer stopProcessor()
	args := []string{"-processor", processorURL}
	var dep *depositor // the deposits, unless naive
	if !h.naive {
		natsDir, err := os.MkdirTemp(h.dir, "nats-")
		if err != nil {
			return outcome{}, err
		}
		natsURL, stopNATS, err := startNATS(natsDir)
		if err != nil {
			return outcome{}, err
		}
		defer stopNATS()
		if dep, err = newDepositor(ctx, natsURL, h.deposits); err != nil {
			return outcome{}, err
		}
		defer dep.close()
		args = append(args, "-nats", natsURL)
	}
	var metricsURL string
	if async {
		// The service with idem: its metrics on a loopback port of their
		// own, and a rate limit above the demo's pace. The demo is one
		// client paying as fast as it can, to show retries, not the limit
		// (TestRateLimit shows that).
		metricsAddr, err := freeport.Addr(ctx)
		if err != nil {
			return outcome{}, err
		}
		metricsURL = "http://" + metricsAddr + "/metrics"
		args = append(args, "-metrics-addr", metricsAddr, "-payment-rate", "100000", "-payment-burst", "100000",
			"-charge-lease", chargeLease.String())
	}
	svc, err := newChild(ctx, h.dir, bin, args, "DATABASE_URL="+h.dbURL, "PROCESSOR_URL=", "METRICS_ADDR=", "NATS_URL=")
	if err != nil {
		return outcome{}, err
	}
	if err := svc.start(ctx); err != nil {
		return outcome{}, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = svc.stop()
		}
	}()
	proxy := newLossyProxy(svc.url, seed, lossRate)
	proxyURL, stopProxy, err := serve(ctx, proxy)
	if err != nil {
		return outcome{}, err
	}
	defer stopProxy()

	// The account is opened directly: the experiment is the payments.
	var direct http.RoundTripper = &http.Transport{DisableKeepAlives: true}
	if h.wrap != nil {
		direct = h.wrap(direct)
	}
	directClient := &http.Client{Transport: direct, Timeout: 10 * time.Second}
	signUp, err := newAPIClient(svc.url, "", directClient)
	if err != nil {
		return outcome{}, err
	}
	created, err := signUp.CreateAccountWithResponse(ctx, api.CreateAccountJSONRequestBody{Owner: "demo"})
	if err != nil {
		return outcome{}, err
	}
	if created.JSON201 == nil {
		return outcome{}, fmt.Errorf("sign-up: status %d", created.StatusCode())
	}
	account, apiKey := created.JSON201.Id, created.JSON201.ApiKey

	var ch *charger // the charges, with idem
	if async && !h.naive {
		chargeProxy := newLossyProxy(svc.url, seed+1, lossRate)
		chargeProxyURL, stopChargeProxy, err := serve(ctx, chargeProxy)
		if err != nil {
			return outcome{}, err
		}
		defer stopChargeProxy()
		if ch, err = newCharger(ctx, signUp, h.charges, chargeProxy, chargeProxyURL, h.wrap); err != nil {
			return outcome{}, err
		}
		slow.account.Store(&ch.account)
	}
	if dep != nil {
		if err := dep.openAccount(ctx, signUp); err != nil {
			return outcome{}, err
		}
	}

	var retries, answered atomic.Int64
	retrying := newRetryingClient(&retries, h.wrap)
	if h.naive {
		retrying = newNaiveClient(&retries, h.wrap)
	}
	payer, err := newAPIClient(proxyURL, apiKey, retrying)
	if err != nil {
		return outcome{}, err
	}
	// Halfway, the service is killed and started again, once it holds
	// deposits it has not acknowledged; the payments, and the charges and
	// deposits that keep pace with them, carry on, and their retries meet
	// a service that is down, then fresh.
	var killer, charging, depositing sync.WaitGroup
	var killErr, depositErr error
	killer.Go(func() {
		for answered.Load() < int64(killAt*float64(len(h.plan))) && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		release := func() {} // holdAtKill's lock
		if dep != nil {
			var blocking func(context.Context) (bool, error)
			if holdAtKill {
				var err error
				if blocking, release, err = dep.hold(ctx, h.pool); err != nil {
					killErr = err
					return
				}
				defer release()
			}
			if killErr = dep.waitInHand(ctx, blocking); killErr != nil {
				return
			}
		}
		if killErr = svc.kill(); killErr != nil {
			return
		}
		if dep != nil {
			if killErr = dep.killed(ctx); killErr != nil {
				return
			}
		}
		// Before the restart: the killed service's credit that waited on
		// the lock holds a lock on the accounts table that the restarted
		// service's migrations wait for; it ends once it has the row.
		release()
		// The answers from here on are the next run's.
		proxy.restarted()
		if ch != nil {
			ch.proxy.restarted()
		}
		killErr = svc.start(ctx)
	})
	if ch != nil {
		charging.Go(func() { ch.chargeAll(ctx, &answered, len(h.plan)) })
	}
	if dep != nil {
		// Publishing, then waiting for the stream to drain, runs on while
		// play waits for settlement; play returning early stops it.
		depCtx, stopDeposits := context.WithCancel(ctx)
		defer depositing.Wait()
		defer stopDeposits()
		depositing.Go(func() {
			if depositErr = dep.publishAll(depCtx, &answered, len(h.plan)); depositErr == nil {
				depositErr = dep.drain(depCtx)
			}
		})
	}
	results := payAll(ctx, payer, account, h.plan, workers, &answered)
	charging.Wait()
	lastAnswer := time.Now()
	killer.Wait()
	if err := errors.Join(ctx.Err(), killErr); err != nil {
		return outcome{}, err
	}

	o := outcome{sent: len(h.plan), expected: openingBalance, kills: 1}
	var ids []uuid.UUID
	for i, r := range results {
		if r.err != nil {
			o.failed = append(o.failed, r.err)
			continue
		}
		o.expected -= h.plan[i].amount
		ids = append(ids, r.payment.Id)
	}
	o.lost, o.retries, o.replays = proxy.lost.Load(), retries.Load(), proxy.replays.Load()

	owner, err := newAPIClient(svc.url, apiKey, directClient)
	if err != nil {
		return outcome{}, err
	}
	if async && !h.naive {
		if o.settling, err = waitSettled(ctx, owner, ids, lastAnswer); err != nil {
			return outcome{}, err
		}
		if o.sync, err = ch.measure(ctx, h.pool, fake, lastAnswer); err != nil {
			return outcome{}, err
		}
	}
	if dep != nil {
		depositing.Wait()
		if depositErr != nil {
			return outcome{}, depositErr
		}
		if o.deposits, err = dep.measure(ctx, h.pool); err != nil {
			return outcome{}, err
		}
	}
	got, err := owner.GetAccountWithResponse(ctx, account)
	if err != nil {
		return outcome{}, err
	}
	if got.JSON200 == nil {
		return outcome{}, fmt.Errorf("read the account: status %d", got.StatusCode())
	}
	o.actual = got.JSON200.Balance
	if async && !h.naive {
		// The service counts its calls and its deposits too, from its
		// start: these are the restarted run's.
		if o.metrics, o.deposits.counted, o.deposits.redeliveries, err = scrape(ctx, metricsURL); err != nil {
			return outcome{}, err
		}
		o.replaysSinceRestart = proxy.replaysSinceRestart()
	}
	stopped = true
	if err := svc.stop(); err != nil {
		return outcome{}, err
	}
	err = h.pool.QueryRow(ctx, `select count(*), count(processor_id) from payments where account_id = $1`, account).Scan(&o.charges, &o.settled)
	if err != nil {
		return outcome{}, err
	}
	for _, c := range fake.Charges() {
		if c.AccountID == account {
			o.processed++
		}
	}
	return o, nil
}

// waitSettled asks GET /payments/{id} for every payment of ids until all
// are settled, or until settleBound after lastAnswer, and returns how long
// after lastAnswer they were (more than settleBound if they were not).
func waitSettled(ctx context.Context, client *api.ClientWithResponses, ids []uuid.UUID, lastAnswer time.Time) (time.Duration, error) {
	pending := ids
	for {
		var still []uuid.UUID
		for _, id := range pending {
			res, err := client.GetPaymentWithResponse(ctx, id)
			if err != nil {
				return 0, err
			}
			if res.JSON200 == nil || !res.JSON200.Settled {
				still = append(still, id)
			}
		}
		elapsed := time.Since(lastAnswer)
		if len(still) == 0 || elapsed > settleBound {
			return elapsed, nil
		}
		pending = still
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func report(out io.Writer, with, without outcome) {
	row := headRows(out, "with idem", "without idem", with, without)
	row("service killed (SIGKILL)", with.kills, without.kills)
	row("charges committed", with.charges, without.charges)
	row("duplicate charges", with.duplicates(), without.duplicates())
	row("expected balance", usd(with.expected), usd(without.expected))
	row("actual balance", usd(with.actual), usd(without.actual))
	row("overcharged", usd(with.expected-with.actual), usd(without.expected-without.actual))
	row("charges at the processor", with.processed, without.processed)
	row("duplicates at the processor", with.processorDuplicates(), without.processorDuplicates())
	row("payments settled", fmt.Sprintf("%d/%d", with.settled, with.charges), fmt.Sprintf("%d/%d", without.settled, without.charges))
	row("settled after last answer", fmt.Sprintf("%.1f s", with.settling.Seconds()), "in the request")
	fmt.Fprintln(out)

	if with.exact() {
		fmt.Fprintf(out, "With idem: every retry was answered from the stored result; each payment was\n"+
			"charged exactly once, the balance is exact, and the processor charged each payment\n"+
			"exactly once, through the kill, its failures and its lost answers.\n")
	} else {
		fmt.Fprintf(out, "With idem: NOT EXACT (%d payments failed: %v).\n", len(with.failed), errors.Join(with.failed...))
	}
	fmt.Fprintf(out, "Without idem: %d retries became %d extra charges; %s was taken twice, and\n"+
		"the processor charged %d times for %d payments.\n",
		without.retries, without.duplicates(), usd(without.expected-without.actual), without.processed, without.sent)

	fmt.Fprintf(out, "\nThe synchronous charges (POST /charges, an idem.Operation finished by idemriver's\n"+
		"completer when its client gave up), with idem:\n")
	reportCharges(out, with.sync)
	reportDeposits(out, with.deposits, without.deposits)

	fmt.Fprintf(out, "\nThe service's own count, from its GET /metrics (idem_calls_total by outcome and\n"+
		"HTTP status; the charges' and the deposits' calls carry none). A process counts\n"+
		"from its start, so these are the restarted one's:\n")
	for _, c := range with.metrics {
		status := c.Status
		if status == "" {
			status = "-"
		}
		by := ""
		if c.Resume {
			by = " (the completer's Resume)"
		}
		fmt.Fprintf(out, "  outcome=%-15s status=%-4s %6d%s\n", c.Outcome, status, c.N, by)
	}
	counted := callmetrics.Of(with.metrics, "replayed")
	d := with.deposits
	fmt.Fprintf(out, "Its deposits consumer, since the restart (deposits_messages_total by result):\n")
	for _, r := range []string{"credited", "refused", "duplicate", "retried", "dead_lettered"} {
		if n, ok := d.counted[r]; ok {
			fmt.Fprintf(out, "  result=%-15s %6d\n", r, n)
		}
	}
	fmt.Fprintf(out, "  and %d redeliveries (deposits_redeliveries_total), of the %d deposits in hand at the kill.\n",
		d.redeliveries, d.inHand)
	fromClients := with.replaysSinceRestart + with.sync.replaysSinceRestart
	fmt.Fprintf(out, "Of the %d replays served, %d came from the restarted service; with the %d duplicate\n"+
		"deposits its consumer dropped, that is %d: its metrics counted %d",
		with.replays+with.sync.replays, fromClients, d.counted["duplicate"], fromClients+d.counted["duplicate"], counted)
	if with.metricsAgree() {
		fmt.Fprintln(out, ".")
	} else {
		fmt.Fprintln(out, ", NOT THE SAME.")
	}
}

// scrape reads the service's GET /metrics at url, on its internal
// listener (no part of the API, so not through the generated client), and
// returns its idem calls by outcome and HTTP status, and its deposits
// consumer's deliveries by result and its redeliveries.
func scrape(ctx context.Context, url string) (calls []callmetrics.Count, deliveries map[string]int64, redeliveries int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, 0, err
	}
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, nil, 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, nil, 0, fmt.Errorf("GET /metrics: status %d", res.StatusCode)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, nil, 0, err
	}
	if calls, err = callmetrics.Read(bytes.NewReader(body)); err != nil {
		return nil, nil, 0, err
	}
	if deliveries, err = callmetrics.Sum(bytes.NewReader(body), callmetrics.DepositsMetric, callmetrics.DepositsResultName); err != nil {
		return nil, nil, 0, err
	}
	re, err := callmetrics.Sum(bytes.NewReader(body), callmetrics.RedeliveriesMetric, "")
	return calls, deliveries, re[""], err
}

// headRows prints the heading of a table that sets a beside b, and the
// rows every such table starts with, and returns the function that
// prints the next rows.
func headRows(out io.Writer, aName, bName string, a, b outcome) func(name string, a, b any) {
	row := func(name string, a, b any) { fmt.Fprintf(out, "  %-28s %16v %16v\n", name, a, b) }
	row("", aName, bName)
	row("payments sent", a.sent, b.sent)
	row("answers lost", a.lost, b.lost)
	row("retries", a.retries, b.retries)
	row("replays served", a.replays, b.replays)
	return row
}

// reportNaive prints the naive client's run beside idemclient's: the same
// payments, the same service with idem, the same lossy network and kill.
func reportNaive(out io.Writer, with, naive outcome) {
	fmt.Fprintf(out, "\nThe same payments to the same service with idem, from two clients: idemclient\n"+
		"(one key per payment, kept across attempts) and a naive one (go-retryablehttp's\n"+
		"defaults, a new Idempotency-Key on every attempt):\n")
	row := headRows(out, "idemclient", "naive client", with, naive)
	row("payments failed", len(with.failed), len(naive.failed))
	row("charges committed", with.charges, naive.charges)
	row("duplicate charges", with.duplicates(), naive.duplicates())
	row("overcharged", usd(with.expected-with.actual), usd(naive.expected-naive.actual))
}

// usd formats cents as "1,234.56 USD".
func usd(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	whole := fmt.Sprint(cents / 100)
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "," + whole[i:]
	}
	return fmt.Sprintf("%s%s.%02d USD", sign, whole, cents%100)
}
