package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemriver"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/processor"
)

// The synchronous charges (POST /charges) that the service with idem takes
// alongside the payments, from an account of their own.
const (
	chargeCount   = 100
	chargeWorkers = 8
	// giveUpShare of the charges' clients send once, wait giveUpAfter
	// and leave for good: no retry, whatever happened.
	giveUpShare = 0.2
	giveUpAfter = 150 * time.Millisecond
	// processorLatency is how long the processor takes to answer a
	// charge: longer than giveUpAfter, so that a client that gives up does
	// so while the service waits for the processor, with no transaction
	// open.
	processorLatency = 400 * time.Millisecond
	// chargeLease is the service's -charge-lease: a charge whose service
	// was killed is taken up again this soon. The completer's job of a
	// charge runs half a lease after it.
	chargeLease = 2 * time.Second
)

// A charge a client wants made exactly once, and whether its client gives
// up on it.
type charge struct {
	key    string
	amount int64
	giveUp bool
}

// makeChargePlan returns the charges to send, drawn from the seed as the
// payments are.
func makeChargePlan() []charge {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	var keySeed [32]byte
	binary.LittleEndian.PutUint64(keySeed[:], seed+1)
	keys := rand.NewChaCha8(keySeed)
	plan := make([]charge, chargeCount)
	for i := range plan {
		key, err := uuid.NewRandomFromReader(keys)
		if err != nil {
			panic(err) // ChaCha8 never fails to read
		}
		plan[i] = charge{key: key.String(), amount: 100 + rng.Int64N(9_901), giveUp: rng.Float64() < giveUpShare}
	}
	return plan
}

// slowProcessor is the processor as the charges meet it: it answers the
// charges of one account (once set) after processorLatency, and every
// other call at once, so that the payments' settlement runs as it does
// without the charges.
type slowProcessor struct {
	next    http.Handler
	account atomic.Pointer[uuid.UUID]
}

func (p *slowProcessor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if acct := p.account.Load(); acct != nil && r.Method == http.MethodPost && r.URL.Path == "/charges" {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "unreadable body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var c processor.Charge
		if json.Unmarshal(body, &c) == nil && c.AccountID == *acct {
			select {
			case <-time.After(processorLatency):
			case <-r.Context().Done():
				return // the service gave up the call
			}
		}
	}
	p.next.ServeHTTP(w, r)
}

// chargeOutcome is what the charges measured.
type chargeOutcome struct {
	sent, gaveUp int
	failed       []error // charges of clients that waited, never answered 201
	lost         int64   // answers the proxy dropped
	retries      int64   // requests the clients sent again
	replays      int64   // answers served from a stored result
	begun        int     // charges that began: one completer job each
	payments     int     // payment rows of the account
	finished     int     // of which charged at the processor and recorded
	byCompleter  int     // finished by the completer, not by a client
	processed    int     // charges the processor made for the account
	unfinished   int64   // idem's count of unfinished operations at the end
	expected     int64   // opening balance minus the charges begun
	actual       int64
	finishing    time.Duration // from the last answer until none was unfinished

	replaysSinceRestart int64
}

// duplicates counts the payment rows beyond one per charge begun, and
// processorDuplicates the processor's charges beyond one per payment.
func (o chargeOutcome) duplicates() int          { return o.payments - o.begun }
func (o chargeOutcome) processorDuplicates() int { return o.processed - o.payments }

func (o chargeOutcome) exact() bool {
	return len(o.failed) == 0 && o.duplicates() == 0 && o.processorDuplicates() == 0 &&
		o.finished == o.payments && o.unfinished == 0 && o.actual == o.expected && o.finishing <= settleBound
}

// charger is the charges' side of a run of the service with idem.
type charger struct {
	plan     []charge
	account  uuid.UUID
	proxy    *lossyProxy
	retrying *api.ClientWithResponses // retries every failure with the key
	once     *api.ClientWithResponses // one try, giveUpAfter
	retries  atomic.Int64
	answered atomic.Int64
	results  []error
}

// newCharger signs up the charges' account through signUp and returns
// the clients that send the plan through proxy (at proxyURL), each
// request's transport wrapped by wrap (nil: none).
func newCharger(ctx context.Context, signUp *api.ClientWithResponses, plan []charge, proxy *lossyProxy, proxyURL string, wrap func(http.RoundTripper) http.RoundTripper) (*charger, error) {
	created, err := signUp.CreateAccountWithResponse(ctx, api.CreateAccountJSONRequestBody{Owner: "demo charges"})
	if err != nil {
		return nil, err
	}
	if created.JSON201 == nil {
		return nil, fmt.Errorf("sign-up: status %d", created.StatusCode())
	}
	c := &charger{plan: plan, account: created.JSON201.Id, proxy: proxy, results: make([]error, len(plan))}
	apiKey := created.JSON201.ApiKey
	if c.retrying, err = newAPIClient(proxyURL, apiKey, newRetryingClient(&c.retries, wrap)); err != nil {
		return nil, err
	}
	var once http.RoundTripper = &http.Transport{DisableKeepAlives: true}
	if wrap != nil {
		once = wrap(once)
	}
	if c.once, err = newAPIClient(proxyURL, apiKey, &http.Client{Transport: once, Timeout: giveUpAfter}); err != nil {
		return nil, err
	}
	return c, nil
}

// chargeAll sends every charge of the plan from chargeWorkers goroutines,
// counting the charges answered (or given up on) as it goes. It keeps
// pace with the payments: charge i goes out once paid of the payments'
// total are answered in proportion, so that the kill halfway through the
// payments meets charges in flight too.
func (c *charger) chargeAll(ctx context.Context, paid *atomic.Int64, total int) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range chargeWorkers {
		wg.Go(func() {
			for i := range next {
				c.results[i] = c.charge(ctx, c.plan[i])
				c.answered.Add(1)
			}
		})
	}
	for i := range c.plan {
		for paid.Load() < int64(i*total/len(c.plan)) && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		next <- i
	}
	close(next)
	wg.Wait()
}

// charge makes one charge; a client that gives up reports no error.
func (c *charger) charge(ctx context.Context, ch charge) error {
	client := c.retrying
	if ch.giveUp {
		client = c.once
	}
	res, err := client.CreateChargeWithResponse(ctx, &api.CreateChargeParams{IdempotencyKey: ch.key},
		api.CreateChargeJSONRequestBody{Amount: ch.amount, Currency: api.USD})
	switch {
	case ch.giveUp:
		return nil // whatever it saw, it is gone
	case err != nil:
		return err
	case res.JSON201 == nil:
		return fmt.Errorf("charge %s: status %d", ch.key, res.StatusCode())
	}
	return nil
}

// measure waits until no operation is unfinished and every completer job
// has ended (up to settleBound after lastAnswer), then reads what the
// charges came to from the database, River's jobs and the processor.
func (c *charger) measure(ctx context.Context, pool *pgxpool.Pool, fake *processor.Fake, lastAnswer time.Time) (chargeOutcome, error) {
	o := chargeOutcome{sent: len(c.plan), expected: openingBalance}
	for i, err := range c.results {
		if c.plan[i].giveUp {
			o.gaveUp++
		} else if err != nil {
			o.failed = append(o.failed, err)
		}
	}
	o.lost, o.retries, o.replays = c.proxy.lost.Load(), c.retries.Load(), c.proxy.replays.Load()
	o.replaysSinceRestart = c.proxy.replaysSinceRestart()

	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		return o, err
	}
	// Each charge that began inserted one completer job, in its first
	// transaction; the job's output, once it ended, says whether it
	// finished the charge.
	var jobs map[string]string
	for {
		st, err := keys.Stats(ctx)
		if err != nil {
			return o, err
		}
		o.unfinished, o.finishing = st.Unfinished, time.Since(lastAnswer)
		if jobs, err = completerJobs(ctx, pool); err != nil {
			return o, err
		}
		running := 0
		for _, outcome := range jobs {
			if outcome == "" {
				running++
			}
		}
		if o.unfinished == 0 && running == 0 || o.finishing > settleBound {
			break
		}
		select {
		case <-ctx.Done():
			return o, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	amounts := map[string]int64{}
	for _, ch := range c.plan {
		amounts[ch.key] = ch.amount
	}
	for key, outcome := range jobs {
		if amount, ok := amounts[key]; ok {
			o.begun++
			o.expected -= amount
			if outcome == "executed" {
				o.byCompleter++
			}
		}
	}
	err = pool.QueryRow(ctx, `select count(*), count(processor_id) from payments where account_id = $1`, c.account).Scan(&o.payments, &o.finished)
	if err != nil {
		return o, err
	}
	if err := pool.QueryRow(ctx, `select balance from accounts where id = $1`, c.account).Scan(&o.actual); err != nil {
		return o, err
	}
	for _, ch := range fake.Charges() {
		if ch.AccountID == c.account {
			o.processed++
		}
	}
	return o, nil
}

// completerJobs returns the key of every completer job and the outcome it
// recorded ("" for a job that has not ended; "cancelled" or "discarded"
// for one River ended without an outcome).
func completerJobs(ctx context.Context, pool *pgxpool.Pool) (map[string]string, error) {
	// An insert-only River client reads the jobs.
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	params := river.NewJobListParams().Kinds(idemriver.CompleteArgs{}.Kind()).First(1000)
	for {
		res, err := rc.JobList(ctx, params)
		if err != nil {
			return nil, err
		}
		for _, j := range res.Jobs {
			var args idemriver.CompleteArgs
			if err := json.Unmarshal(j.EncodedArgs, &args); err != nil {
				return nil, err
			}
			var r idemriver.Result
			switch j.State {
			case rivertype.JobStateCompleted:
				if err := json.Unmarshal(j.Output(), &r); err != nil {
					return nil, err
				}
			case rivertype.JobStateCancelled, rivertype.JobStateDiscarded:
				r.Outcome = string(j.State)
			}
			out[args.Key] = r.Outcome
		}
		if len(res.Jobs) == 0 || res.LastCursor == nil {
			return out, nil
		}
		params = params.After(res.LastCursor)
	}
}

// reportCharges prints what the charges came to.
func reportCharges(out io.Writer, o chargeOutcome) {
	row := func(name string, v any) { fmt.Fprintf(out, "  %-36s %16v\n", name, v) }
	row("", "with idem")
	row("charges attempted", o.sent)
	row("clients that gave up", o.gaveUp)
	row("answers lost", o.lost)
	row("retries", o.retries)
	row("replays served", o.replays)
	row("charges begun", o.begun)
	row("given up before they began", o.sent-o.begun)
	row("charges finished", fmt.Sprintf("%d/%d", o.finished, o.payments))
	row("finished by the completer", o.byCompleter)
	row("duplicate payments", o.duplicates())
	row("charges at the processor", o.processed)
	row("duplicate charges at the processor", o.processorDuplicates())
	row("unfinished at the end", o.unfinished)
	row("overcharged", usd(o.expected-o.actual))
	row("finished after last answer", fmt.Sprintf("%.1f s", o.finishing.Seconds()))
	fmt.Fprintln(out)
	if o.exact() {
		fmt.Fprintf(out, "Every charge that began was finished, %d of them by the completer alone, for\n"+
			"clients that never came back; the processor charged each payment exactly once.\n", o.byCompleter)
	} else {
		fmt.Fprintf(out, "Charges: NOT EXACT (%d charges failed: %v).\n", len(o.failed), errors.Join(o.failed...))
	}
}
