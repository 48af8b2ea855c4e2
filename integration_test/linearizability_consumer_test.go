package integration_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/testkit/lincheck"
	"github.com/idemhq/idem/testkit/testdb"
)

// The consumer workload's shape.
const (
	linConsClients  = 8
	linConsPoolSize = 3 // fewer connections than deliverers: deliveries queue for one
	// A new message every linConsKeyStep publishes; each publish picks one
	// of the linConsWindow messages from the current step on, so every
	// message is delivered by several deliverers at once, then again as
	// they move on. The window slides by publishes, not by the clock: on a
	// loaded machine a delivery outlasts any step of time, and the window
	// would pass every message before it was published again.
	linConsKeyStep = linConsClients
	linConsWindow  = 4
	// Every linConsOtherEvery-th message is also published with another
	// payload, but only once its own was acknowledged: each of those
	// publishes must be dead-lettered with ErrMismatch. One publish in
	// linConsOtherOneIn is one of them, under the id of the last such
	// message acknowledged, rather than when the window happens to pick
	// such a message again: so every run, however slow its deliveries,
	// has some once one of them was acknowledged.
	linConsOtherEvery = 4
	linConsOtherOneIn = 8
	// linConsShortRun is the short form's run, in every test run: shorter
	// than the other workloads', since its keys are few and busy. The long
	// form and IDEM_LINEARIZABILITY_DURATION run as long as theirs.
	linConsShortRun = 3 * time.Second
	// linConsName is the consumer's name: its keys are in the scope
	// "consumer:" + linConsName.
	linConsName = "lin"
	// linConsMaxDeliveries is out of reach, so that a dead letter means
	// ErrMismatch and every retried publish is redelivered until it is
	// acknowledged.
	linConsMaxDeliveries = 1 << 30
	// linConsRedelivery is the broker's delay before a redelivery (the
	// consumer's Backoff and InProgressDelay, and an ack deadline).
	linConsRedelivery = 10 * time.Millisecond
	// linConsClientApp is the application_name of the deliverers'
	// connections, which the fault injector terminates; linConsSettleApp
	// that of the redeliveries once the faults stopped.
	linConsClientApp = "idem-linearizability-consumer"
	linConsSettleApp = "idem-linearizability-consumer-settle"
	// linConsSettleBound bounds the redeliveries once the faults stopped.
	linConsSettleBound = 60 * time.Second
)

// linConsumedSQL is the handler's effect: one row per committed handling
// of a message, tagged with its key and the delivery, with no unique
// constraint that would hide a second one.
const linConsumedSQL = `CREATE TABLE lin_consumed (
    id  bigserial PRIMARY KEY,
    key text   NOT NULL,
    op  bigint NOT NULL
)`

// TestLinearizabilityConsumer checks idemconsume.Consumer.Process from
// outside, beside TestLinearizability: deliverers publish a sliding window
// of hot messages and deliver each publish, as a broker would, until it is
// acknowledged or dead-lettered, honouring the delay of every Retry; every
// message is published many times (a producer's retries, a rebalance) and
// a few, once acknowledged, with another payload under the same id.
// Handlers write an effect row in the key's transaction, some hold it
// open, some fail; some deliveries get a short deadline, as an ack
// deadline; backends of the test database are terminated every 20 to
// 150 ms. Once the faults stop, every publish still unsettled is
// redelivered until it is.
//
// Each message key's deliveries are checked as Do's write-once register
// (lincheck.CheckDeliveries), each ending at its settlement: an Ack must
// follow the commit of the message's effect. The database is reconciled
// with them, and, apart from the model, the broker's side is checked: every
// publish of a message's payload acknowledged, every one of another payload
// dead-lettered with ErrMismatch, each message's effect row exactly once.
func TestLinearizabilityConsumer(t *testing.T) {
	t.Parallel()
	settings := linSettingsFromEnv(t)
	duration := settings.duration
	if os.Getenv("IDEM_LINEARIZABILITY") != "long" && os.Getenv("IDEM_LINEARIZABILITY_DURATION") == "" {
		duration = linConsShortRun
	}
	for _, seed := range settings.seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runLinConsumer(t, seed, duration)
		})
	}
}

func runLinConsumer(t *testing.T, seed uint64, duration time.Duration) {
	ctx := context.Background()
	u := testdb.URL(t)
	admin, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := admin.Exec(ctx, linConsumedSQL); err != nil {
		t.Fatal(err)
	}
	faults, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = faults.Close(context.Background()) })

	w := &linConsWorkload{url: u, seed: seed, duration: duration,
		details: map[string]int{}, messages: map[string]*linMessage{}}
	stop := make(chan struct{})
	injected := make(chan linFaults, 1)
	go func() { injected <- terminateBackends(faults, seed, []string{linConsClientApp}, stop) }()
	runErr := w.run(ctx)
	close(stop)
	f := <-injected
	if f.err != nil {
		t.Errorf("fault injector: %v", f.err)
	}
	if runErr != nil {
		t.Fatalf("deliverers: %v", runErr)
	}
	// A COMMIT whose client gave up may still be running on the server:
	// every backend under test ends before the redeliveries and the read.
	settleBackends(t, admin, []string{linConsClientApp})
	redelivered := len(w.deliveries)
	unsettled, err := w.settle(ctx)
	if err != nil {
		t.Fatalf("redelivering: %v", err)
	}
	redelivered = len(w.deliveries) - redelivered
	settleBackends(t, admin, []string{linConsSettleApp})
	final := readConsFinal(t, admin)
	checkStart := time.Now()
	r := lincheck.CheckDeliveries(w.deliveries, final, linCheckBound)
	checked := time.Since(checkStart)

	publishes, others := 0, 0
	for _, m := range w.messages {
		publishes += m.published + m.others
		others += m.others
	}
	t.Logf("consumer, seed %d, %v: %d deliveries of %d messages (%d publishes, %d of them with another payload), %d of the deliveries after the faults stopped; by kind: %s; in detail: %s; faults injected: %d backends terminated (%d rounds); violations: %d; keys the checker could not decide in time: %d %v; checked in %v",
		seed, duration, r.Calls, len(w.messages), publishes, others, redelivered, byKind(r), details(w.details),
		f.byApp[linConsClientApp], f.attempts, len(r.Violations), len(r.Inconclusive), r.Inconclusive, checked.Round(time.Millisecond))
	if len(unsettled) > 0 {
		t.Errorf("%d publishes still unsettled after redelivering for %v: %v", len(unsettled), linConsSettleBound, unsettled)
	}
	reportViolations(t, r.Violations)
	w.checkMessages(t, final)
	if r.ByKind[lincheck.Executed] == 0 || r.ByKind[lincheck.Replayed] == 0 || r.ByKind[lincheck.Mismatch] == 0 ||
		f.byApp[linConsClientApp] == 0 {
		t.Errorf("the run proved nothing: %d executions, %d replays, %d mismatches, %d backends terminated",
			r.ByKind[lincheck.Executed], r.ByKind[lincheck.Replayed], r.ByKind[lincheck.Mismatch], f.byApp[linConsClientApp])
	}
}

// linConsWorkload is one run's deliverers and what they recorded.
type linConsWorkload struct {
	url      string
	seed     uint64
	duration time.Duration

	start      time.Time
	ops        atomic.Int64
	mu         sync.Mutex
	deliveries []lincheck.Delivery
	// details counts the deliveries by settlement and a finer class than
	// lincheck.Kind, for the report.
	details map[string]int
	// messages holds what became of each message's publishes.
	messages map[string]*linMessage
	// publishes counts the publishes so far: the window's position.
	publishes int
	// othered holds, in order, the numbers of the messages that get
	// another payload whose own was acknowledged.
	othered []int
	// pending holds the publishes left unsettled when the run ended.
	pending []*linPublish
}

// linMessage is what became of one message's publishes: of its payload,
// and of another payload under its id.
type linMessage struct {
	published, acked   int
	others, mismatched int
}

// linPublish is one publish of a message: the broker delivers it until it
// is acknowledged or dead-lettered.
type linPublish struct {
	key        string
	n          int  // the message's number
	other      bool // another payload under the message's id
	payload    []byte
	deliveries int // made so far
}

// linConsPlan is what one delivery's handler does, drawn before it starts.
// The handler reads it from its context.
type linConsPlan struct {
	op       int64 // the delivery's id, written to the effect row
	fail     bool  // the handler fails after its write
	hold     time.Duration
	deadline time.Duration
}

type linConsPlanKey struct{}

// linConsHandler writes the message's effect in the key's transaction,
// holds the transaction if the plan says so, and fails on purpose if it
// says so.
func linConsHandler(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
	p := ctx.Value(linConsPlanKey{}).(*linConsPlan)
	if _, err := tx.Exec(ctx, "INSERT INTO lin_consumed (key, op) VALUES ($1, $2)", m.ID, p.op); err != nil {
		return err
	}
	if p.hold > 0 {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep($1::float8)", p.hold.Seconds()); err != nil {
			return err
		}
	}
	if p.fail {
		return errLinFailed
	}
	return nil
}

// consumer makes a consumer on a pool of size connections named app.
func (w *linConsWorkload) consumer(ctx context.Context, app string, size int32) (*pgxpool.Pool, *idemconsume.Consumer, error) {
	cfg, err := pgxpool.ParseConfig(w.url)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = size
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	c, err := idemconsume.New(pool, &idemconsume.Config{
		Name:            linConsName,
		MaxDeliveries:   linConsMaxDeliveries,
		Backoff:         func(int) time.Duration { return linConsRedelivery },
		InProgressDelay: linConsRedelivery,
	}, linConsHandler)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, c, nil
}

// run delivers from linConsClients goroutines for w.duration; it closes
// its pool before it returns.
func (w *linConsWorkload) run(ctx context.Context) error {
	w.start = time.Now()
	pool, c, err := w.consumer(ctx, linConsClientApp, linConsPoolSize)
	if err != nil {
		return err
	}
	defer pool.Close()
	var wg sync.WaitGroup
	for client := range linConsClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(w.seed, 1<<48+uint64(client)))
			var pub *linPublish
			for time.Since(w.start) < w.duration {
				if pub == nil {
					pub = w.publish(rng)
				}
				settled, delay := w.deliver(c, client, pub, w.plan(rng), "")
				if settled == lincheck.Acked || settled == lincheck.DeadLettered {
					pub = nil
					continue
				}
				time.Sleep(delay)
			}
			if pub != nil {
				w.mu.Lock()
				w.pending = append(w.pending, pub)
				w.mu.Unlock()
			}
		})
	}
	wg.Wait()
	return nil
}

// publish picks a message of the window and publishes it, or now and
// then publishes another payload under the id of the last message that
// gets one and whose own payload was acknowledged: it is the most likely
// to be still in the window, its own payload still being delivered.
func (w *linConsWorkload) publish(rng *rand.Rand) *linPublish {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.publishes/linConsKeyStep + rng.IntN(linConsWindow)
	w.publishes++
	other := len(w.othered) > 0 && rng.IntN(linConsOtherOneIn) == 0
	if other {
		n = w.othered[len(w.othered)-1]
	}
	key := fmt.Sprintf("m-%05d", n)
	m := w.messages[key]
	if m == nil {
		m = &linMessage{}
		w.messages[key] = m
	}
	variant := "main"
	if other {
		m.others++
		variant = "other"
	} else {
		m.published++
	}
	return &linPublish{key: key, n: n, other: other, payload: fmt.Appendf(nil, `{"message":%d,"variant":%q}`, n, variant)}
}

func (w *linConsWorkload) plan(rng *rand.Rand) linConsPlan {
	p := linConsPlan{op: w.ops.Add(1), fail: rng.IntN(10) == 0, deadline: linCallBound}
	if rng.IntN(4) == 0 {
		p.hold = time.Duration(5+rng.IntN(35)) * time.Millisecond
	}
	if rng.IntN(8) == 0 {
		p.deadline = time.Duration(5+rng.IntN(55)) * time.Millisecond
	}
	return p
}

// linSettler is the broker's side of one delivery: what Process told it,
// and when, on the run's clock.
type linSettler struct {
	start   time.Time
	calls   int // Settler methods called
	settled lincheck.Settlement
	at      int64
	delay   time.Duration
	reason  error
}

func (s *linSettler) settle(a lincheck.Settlement) {
	s.calls++
	if s.calls == 1 {
		s.settled, s.at = a, int64(time.Since(s.start))
	}
}

func (s *linSettler) Ack(context.Context) error { s.settle(lincheck.Acked); return nil }

func (s *linSettler) Retry(_ context.Context, delay time.Duration) error {
	s.settle(lincheck.Retried)
	s.delay = delay
	return nil
}

func (s *linSettler) DeadLetter(_ context.Context, reason error) error {
	s.settle(lincheck.DeadLettered)
	s.reason = reason
	return nil
}

// deliver makes one delivery of pub, records it with its class prefixed
// by phase, and returns how it was settled and the delay before a
// redelivery.
func (w *linConsWorkload) deliver(proc idemconsume.Processor, client int, pub *linPublish, p linConsPlan, phase string) (lincheck.Settlement, time.Duration) {
	pub.deliveries++
	m := &idemconsume.Message{ID: pub.key, Payload: pub.payload, Deliveries: pub.deliveries}
	ctx, cancel := context.WithTimeout(context.Background(), p.deadline)
	defer cancel()
	ctx = context.WithValue(ctx, linConsPlanKey{}, &p)
	// An unsettled delivery comes back once the broker's ack deadline
	// passed: linConsRedelivery, as a retried one.
	s := &linSettler{start: w.start, delay: linConsRedelivery}
	d := lincheck.Delivery{Call: lincheck.Call{Client: client, Key: pub.key, Hash: idem.HashBytes(pub.payload),
		Op: p.op, Start: int64(time.Since(w.start))}}
	res, err := proc.Process(ctx, m, s)
	returned := int64(time.Since(w.start))
	detail := classifyDelivery(&d, s, res, err, ctx.Err(), returned)

	w.mu.Lock()
	defer w.mu.Unlock()
	w.deliveries = append(w.deliveries, d)
	w.details[phase+detail]++
	msg := w.messages[pub.key]
	switch {
	case d.Settled == lincheck.Acked && !pub.other:
		msg.acked++
		if msg.acked == 1 && pub.n%linConsOtherEvery == 0 {
			w.othered = append(w.othered, pub.n)
		}
	case d.Settled == lincheck.DeadLettered && pub.other && errors.Is(s.reason, idem.ErrMismatch):
		msg.mismatched++
	}
	return d.Settled, s.delay
}

// classifyDelivery fills in how the delivery ended: Run's outcome, as
// Process reported it, and the settlement, as the Settler heard it, at
// the moment it heard it (when Process returned, if it heard nothing). It
// returns a finer class for the report. What Process's answers cannot
// all be, and errors the workload cannot cause, are contradictions.
func classifyDelivery(d *lincheck.Delivery, s *linSettler, res idemconsume.Result, err, ctxErr error, returned int64) string {
	d.Settled, d.End = s.settled, s.at
	if s.calls == 0 {
		d.End = returned
	}
	if res.Err != nil {
		d.Err = res.Err.Error()
	}
	contradict := func(format string, args ...any) {
		if d.Contradiction == "" {
			d.Contradiction = fmt.Sprintf(format, args...) +
				fmt.Sprintf(" (outcome %v, action %v, error %v, returned %v)", res.Outcome, res.Action, res.Err, err)
		}
	}
	told := map[idemconsume.Action]lincheck.Settlement{
		idemconsume.Ack: lincheck.Acked, idemconsume.Retry: lincheck.Retried, idemconsume.DeadLetter: lincheck.DeadLettered,
	}
	switch {
	case s.calls > 1:
		contradict("Process called %d Settler methods", s.calls)
	case s.calls == 0 && (ctxErr == nil || !errors.Is(err, ctxErr)):
		contradict("Process settled nothing, though its context had not ended")
	case s.calls == 1 && told[res.Action] != s.settled:
		contradict("Process reported %v, but told the broker %v", res.Action, s.settled)
	case s.calls == 1 && err != nil:
		contradict("Process returned an error, but the Settler returned none")
	case s.settled == lincheck.DeadLettered && !errors.Is(s.reason, idem.ErrMismatch):
		contradict("dead-lettered for %v: the workload's deliveries never reach MaxDeliveries", s.reason)
	}
	agrees := func(want error) {
		if !errors.Is(res.Err, want) {
			contradict("an Outcome its error contradicts")
		}
	}
	var class string
	switch res.Outcome {
	case idem.OutcomeExecuted, idem.OutcomeReplayed:
		d.Kind = lincheck.Replayed
		if res.Outcome == idem.OutcomeExecuted {
			d.Kind, d.Value = lincheck.Executed, d.Op
		}
		if res.Err != nil {
			contradict("an Outcome its error contradicts")
		}
		class = d.Kind.String()
	case idem.OutcomeInProgress:
		d.Kind, class = lincheck.InProgress, "in_progress"
		agrees(idem.ErrInProgress)
	case idem.OutcomeUnknown:
		d.Kind, class = lincheck.Unknown, "outcome_unknown"
		agrees(idem.ErrOutcomeUnknown)
	case idem.OutcomeMismatch:
		d.Kind, class = lincheck.Mismatch, "mismatch"
		agrees(idem.ErrMismatch)
	case idem.OutcomeFailed:
		d.Kind, class = lincheck.Failed, "failed: "+failedClass(res.Err)
		if class == "failed: unexpected" {
			contradict("an error the workload cannot cause")
		}
	default:
		// The handler never refuses, and every message has a key.
		d.Kind, class = lincheck.Failed, "unexpected"
		contradict("an Outcome the workload cannot cause")
	}
	return d.Settled.String() + " (" + class + ")"
}

// failedClass names a failed Run's cause for the report: "unexpected" for
// the errors that mean the protocol let two deliveries hold one key, or
// read back what it did not write.
func failedClass(err error) string {
	switch {
	case err == nil, errors.Is(err, idem.ErrInvalidOption), errors.Is(err, idem.ErrKeyLost), errors.Is(err, idem.ErrCorruptRecord):
		return "unexpected"
	case errors.Is(err, errLinFailed):
		return "handler failed"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	if code := pgCode(err); code != "" {
		return "SQLSTATE " + code
	}
	return "connection"
}

// settle redelivers every publish left unsettled, once the faults
// stopped, until it is acknowledged or dead-lettered, as the broker would.
// Its deliveries join the history. It returns the keys of the publishes
// still unsettled after linConsSettleBound.
func (w *linConsWorkload) settle(ctx context.Context) ([]string, error) {
	pool, c, err := w.consumer(ctx, linConsSettleApp, 2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	slices.SortFunc(w.pending, func(a, b *linPublish) int { return cmp.Compare(a.key, b.key) })
	deadline := time.Now().Add(linConsSettleBound)
	var unsettled []string
	for _, pub := range w.pending {
		for {
			settled, delay := w.deliver(c, linConsClients, pub, linConsPlan{op: w.ops.Add(1), deadline: linCallBound}, "settle ")
			if settled == lincheck.Acked || settled == lincheck.DeadLettered {
				break
			}
			if time.Now().After(deadline) {
				unsettled = append(unsettled, pub.key)
				break
			}
			time.Sleep(delay)
		}
	}
	return unsettled, nil
}

// checkMessages checks the settled run from the broker's side, apart from
// the model: every publish of a message's payload was acknowledged, every
// publish of another payload dead-lettered with ErrMismatch, and every
// message has its effect row exactly once; no other key has any.
func (w *linConsWorkload) checkMessages(t *testing.T, final lincheck.Final) {
	t.Helper()
	var wrong []string
	for _, key := range slices.Sorted(maps.Keys(w.messages)) {
		m := w.messages[key]
		if m.acked != m.published {
			wrong = append(wrong, fmt.Sprintf("message %s: %d of its %d publishes acknowledged", key, m.acked, m.published))
		}
		if m.mismatched != m.others {
			wrong = append(wrong, fmt.Sprintf("message %s: %d of its %d publishes with another payload dead-lettered with ErrMismatch", key, m.mismatched, m.others))
		}
		if n := len(final.Ledger[key]); m.acked > 0 && n != 1 {
			wrong = append(wrong, fmt.Sprintf("message %s: acknowledged, and its effect committed %d times", key, n))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(final.Ledger)) {
		if w.messages[key] == nil {
			wrong = append(wrong, fmt.Sprintf("effect rows under key %s, which was never published", key))
		}
	}
	for i, s := range wrong {
		if i == linMaxReported {
			t.Errorf("... and %d more", len(wrong)-i)
			break
		}
		t.Error(s)
	}
}

// readConsFinal reads every key's row in the consumer's scope and every
// effect row.
func readConsFinal(t *testing.T, admin *pgxpool.Pool) lincheck.Final {
	t.Helper()
	ctx := context.Background()
	final := lincheck.Final{Keys: map[string]lincheck.Stored{}, Ledger: map[string][]int64{}}
	rows, err := admin.Query(ctx,
		"SELECT idempotency_key, status, request_hash, refusal IS NOT NULL FROM idempotency_keys WHERE scope = $1",
		"consumer:"+linConsName)
	if err != nil {
		t.Fatal(err)
	}
	var (
		key string
		s   lincheck.Stored
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &s.Status, &s.Hash, &s.Refused}, func() error {
		final.Keys[key] = s
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rows, err = admin.Query(ctx, "SELECT key, op FROM lin_consumed")
	if err != nil {
		t.Fatal(err)
	}
	var op int64
	if _, err := pgx.ForEachRow(rows, []any{&key, &op}, func() error {
		final.Ledger[key] = append(final.Ledger[key], op)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return final
}
