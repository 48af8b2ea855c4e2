package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/lincheck"
)

// The operation clients of the linearizability check, which run beside the
// Do clients on the plain layout (the partitioned one refuses operations).
// Each is a service instance of its own, with its own pool and Client: a
// paused instance starves its own lease renewals, as a process stopped by
// SIGSTOP or a long GC pause does, and another instance takes its
// operations over.
const (
	linOpClients  = 5
	linOpPoolSize = 2
	// linOpLease is short, so that takeovers happen within a short run.
	linOpLease = 300 * time.Millisecond
	// A new operation key every linOpKeyStep; each Run picks one of the
	// linOpWindow keys from the current step on, and each Resume, as a
	// completer looking for abandoned operations, one of the linOpBehind
	// keys before them too.
	linOpKeyStep = 200 * time.Millisecond
	linOpWindow  = 4
	linOpBehind  = 10
	// linOpClientApp is the application_name of the operation clients'
	// connections, which the fault injector terminates too.
	linOpClientApp = "idem-linearizability-op"
	// linOpSettleApp is the application_name of the settling completer,
	// which runs once the faults stopped.
	linOpSettleApp = "idem-linearizability-settle"
	// linOpSettleBound bounds the settling of every operation.
	linOpSettleBound = 60 * time.Second
	// linOpStep is the name of the operation's external step: its derived
	// key is CallKey.Derive(linOpStep).
	linOpStep = "charge"
	// linOpLostBound bounds how long a paused owner that was taken over
	// waits for its step's context to end with ErrLeaseLost: a renewal
	// every third of linOpLease finds the lease gone long before, so the
	// bound decides nothing unless the owner would run on regardless.
	linOpLostBound = 10 * time.Second
)

// linOpLedgerSQL is the business table of the operation's two database
// steps: one row per run of a step, tagged with the key, the step and the
// call whose owner ran it, with no unique constraint that would hide a
// second run.
const linOpLedgerSQL = `CREATE TABLE lin_op_ledger (
    id   bigserial PRIMARY KEY,
    key  text   NOT NULL,
    step text   NOT NULL,
    op   bigint NOT NULL
)`

// linOpReq is the operation's request. Each key has two, "main" and
// "other" (one call in ten): once one of them began the key's operation,
// calls with the other get ErrMismatch.
type linOpReq struct {
	Variant string `json:"variant"`
	Amount  int64  `json:"amount"`
}

// linOpAmount is the amount of key n's request: the provider declines key
// n's charge, whichever its request, when linOpDeclines(n).
func linOpAmount(n int, variant string) int64 {
	if variant == "other" {
		return int64(10*n + 5)
	}
	return int64(10 * n)
}

func linOpDeclines(n int) bool { return n%6 == 0 }

// linOpAnswer is the operation's answer: which call's owner ran each step,
// the provider's effect, and which call stored it. The last is not a
// step's output: every owner puts its own call there, so that the stored
// answer names the call that stored it.
type linOpAnswer struct {
	Variant  string `json:"variant"`
	Reserve  int64  `json:"reserve"`
	Effect   string `json:"effect"`
	ChargeBy int64  `json:"charge_by"`
	Receipt  int64  `json:"receipt,omitempty"` // 0 when the charge was declined
	Finisher int64  `json:"finisher"`
}

func (a linOpAnswer) text() string { return fmt.Sprintf("%+v", a) }

// linCharge is the external step's output: the provider's answer, and the
// call whose owner got it.
type linCharge struct {
	ID       string `json:"id"`
	Declined bool   `json:"declined,omitempty"`
	By       int64  `json:"by"`
}

var (
	errLinOpDeclined   = idem.Refuse("declined", "the provider declined the charge")
	errLinOpUnreached  = errors.New("the provider could not be reached")
	errLinOpAnswerLost = errors.New("the provider's answer was lost")
)

// linProvider is the fake provider of the external step. It honours
// idempotency keys: the first call with a key acts (an effect), every
// later one with that key answers with the same effect. It keeps every
// effect it made, so that the run is reconciled at the provider.
type linProvider struct {
	mu      sync.Mutex
	byKey   map[string]lincheck.Effect
	effects []lincheck.Effect
	calls   int
}

// charge waits latency (the provider's work), then acts once per
// idemKey. opKey is what the call's body says it is for; the provider does
// not deduplicate by it.
func (p *linProvider) charge(ctx context.Context, idemKey, opKey string, amount, op int64, latency time.Duration) (linCharge, error) {
	t := time.NewTimer(latency)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return linCharge{}, ctx.Err()
	case <-t.C:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	e, ok := p.byKey[idemKey]
	if !ok {
		e = lincheck.Effect{Key: opKey, DerivedKey: idemKey, ID: fmt.Sprintf("e-%d", len(p.effects)+1), Op: op}
		p.byKey[idemKey] = e
		p.effects = append(p.effects, e)
	}
	return linCharge{ID: e.ID, Declined: linOpDeclines(int(amount / 10)), By: op}, nil
}

// linOpPlan is what one call does, drawn before it starts. The operation's
// function reads it from the call's context, so that each owner, Resume's
// too, runs its own plan.
type linOpPlan struct {
	key      string
	n        int
	req      linOpReq
	op       int64
	resume   bool
	deadline time.Duration
	// fail is where the owner's run fails on purpose: "reserve" and
	// "receipt" inside the step (rolled back), "unreached" before the
	// provider acts, "lost" after it acted.
	fail string
	// pause is when the owner pauses, holding every connection of its
	// instance's pool: "before" or "after" the provider acts. After the
	// provider acted, the owner then returns the provider's answer, as a
	// process would that did not know it had been paused.
	pause    string
	pauseFor time.Duration
	latency  time.Duration
	// hold is how long each database step holds its transaction open;
	// some holds outlast the lease, which no takeover may interrupt.
	hold time.Duration

	// What the owner's run found, for classify: ranPastLoss, an owner
	// taken over whose step's context had not ended linOpLostBound later;
	// leaseLost, one whose step's context ended with ErrLeaseLost.
	ranPastLoss, leaseLost bool
}

type linOpPlanKey struct{}

// linOpClient is one service instance: a pool, a Client, the operation.
type linOpClient struct {
	pool *pgxpool.Pool
	op   *idem.Operation[linOpReq, linOpAnswer]
}

// linOpWorkload is one run's operation clients and what they recorded.
type linOpWorkload struct {
	url      string
	seed     uint64
	duration time.Duration
	provider *linProvider

	start time.Time
	ops   atomic.Int64
	mu    sync.Mutex
	calls []lincheck.OpCall
	// details counts the calls by a finer class than lincheck.Kind.
	details map[string]int
	// owners counts, per key, the runs of the operation's function: one
	// per owner, so every run after a key's first is a takeover.
	owners map[string]int
	// resumed counts the owner runs that found the first step recorded.
	resumed int
	// pauses counts the owners paused, and overtaken those of them that
	// lost their lease meanwhile.
	pauses, overtaken int
	// fenced holds, per step, the calls whose owner returned from the
	// step's function after it lost its lease.
	fenced map[string]map[int64]bool
	// settled counts the settling Resume calls, and completed those of
	// them that finished an operation.
	settled, completed int
	// runs holds, per key, the runs (idem.CallKey.Run) whose owners called
	// the provider: one per key, since no key is forgotten or expires.
	runs map[string]map[string]bool
}

func newLinOpWorkload(url string, seed uint64, duration time.Duration) *linOpWorkload {
	return &linOpWorkload{url: url, seed: seed, duration: duration,
		provider: &linProvider{byKey: map[string]lincheck.Effect{}},
		details:  map[string]int{}, owners: map[string]int{}, fenced: map[string]map[int64]bool{},
		runs: map[string]map[string]bool{}}
}

// client makes a service instance with a pool of size connections named
// app.
func (w *linOpWorkload) client(ctx context.Context, app string, size int32) (*linOpClient, error) {
	cfg, err := pgxpool.ParseConfig(w.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = size
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	c, err := idem.NewClient(pool, nil)
	if err != nil {
		pool.Close()
		return nil, err
	}
	op, err := idem.NewOperation(c, "lin-charge", w.steps(pool),
		&idem.OperationConfig[linOpReq, linOpAnswer]{Lease: linOpLease})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &linOpClient{pool: pool, op: op}, nil
}

// steps is the operation: reserve (a database step), charge (an external
// step at the provider), receipt (a database step), or a refusal when the
// provider declines.
func (w *linOpWorkload) steps(pool *pgxpool.Pool) func(st *idem.Steps, req linOpReq) (linOpAnswer, error) {
	return func(st *idem.Steps, req linOpReq) (linOpAnswer, error) {
		p := st.Context().Value(linOpPlanKey{}).(*linOpPlan)
		key := st.Key().Key
		ran := false
		w.mu.Lock()
		w.owners[key]++
		// A later owner's run of the key (owners[key] past run) took the
		// operation over with a newer token: this owner's lease is lost.
		run := w.owners[key]
		w.mu.Unlock()
		a := linOpAnswer{Variant: req.Variant, Finisher: p.op}
		var err error
		a.Reserve, err = idem.Step(st, "reserve", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			ran = true
			return w.dbStep(ctx, tx, p, key, "reserve")
		})
		if err != nil {
			return linOpAnswer{}, err
		}
		if !ran {
			w.mu.Lock()
			w.resumed++
			w.mu.Unlock()
		}
		ch, err := idem.External(st, linOpStep, func(ctx context.Context, idemKey string) (linCharge, error) {
			w.ran(key, st.Key().Run)
			if p.pause == "before" {
				pauseInstance(ctx, pool, p.pauseFor)
				w.paused(ctx, p, key, run)
			}
			if p.fail == "unreached" {
				return linCharge{}, errLinOpUnreached
			}
			ch, err := w.provider.charge(ctx, idemKey, key, req.Amount, p.op, p.latency)
			if err != nil {
				return linCharge{}, err
			}
			if p.pause == "after" {
				pauseInstance(ctx, pool, p.pauseFor)
				// The renewal that waited for the pool learns whether
				// another owner took over meanwhile.
				linOpWaitLease(ctx)
				w.paused(ctx, p, key, run)
			}
			if p.fail == "lost" {
				return linCharge{}, errLinOpAnswerLost
			}
			w.returning(ctx, linOpStep, p.op)
			return ch, nil
		})
		if err != nil {
			return linOpAnswer{}, err
		}
		a.Effect, a.ChargeBy = ch.ID, ch.By
		if ch.Declined {
			return a, errLinOpDeclined
		}
		a.Receipt, err = idem.Step(st, "receipt", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			return w.dbStep(ctx, tx, p, key, "receipt")
		})
		if err != nil {
			return linOpAnswer{}, err
		}
		return a, nil
	}
}

// dbStep writes the step's ledger row, holds the transaction if the plan
// says so, and fails on purpose if it says so.
func (w *linOpWorkload) dbStep(ctx context.Context, tx pgx.Tx, p *linOpPlan, key, step string) (int64, error) {
	if _, err := tx.Exec(ctx, "INSERT INTO lin_op_ledger (key, step, op) VALUES ($1, $2, $3)", key, step, p.op); err != nil {
		return 0, err
	}
	if p.hold > 0 {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep($1::float8)", p.hold.Seconds()); err != nil {
			return 0, err
		}
	}
	if p.fail == step {
		return 0, errLinFailed
	}
	w.returning(ctx, step, p.op)
	return p.op, nil
}

// returning notes a step function that returns its output although its
// owner lost its lease: fencing must keep that output from being recorded.
func (w *linOpWorkload) returning(ctx context.Context, step string, op int64) {
	if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fenced[step] == nil {
		w.fenced[step] = map[int64]bool{}
	}
	w.fenced[step][op] = true
}

// paused counts a pause, and whether the owner lost its lease in it. An
// owner whose run of key (its run-th) another owner's run followed was
// taken over: its lease is lost for good, and its step's context must end
// with ErrLeaseLost (Steps.Context, External), which it waits for up to
// linOpLostBound; an owner that runs on past the bound contradicts its
// call. A context ended otherwise (the call's deadline) proves nothing.
func (w *linOpWorkload) paused(ctx context.Context, p *linOpPlan, key string, run int) {
	w.mu.Lock()
	w.pauses++
	takenOver := w.owners[key] > run
	w.mu.Unlock()
	if takenOver {
		bound := time.NewTimer(linOpLostBound)
		defer bound.Stop()
		select {
		case <-ctx.Done():
		case <-bound.C:
			p.ranPastLoss = true
		}
	}
	p.leaseLost = errors.Is(context.Cause(ctx), idem.ErrLeaseLost)
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.leaseLost {
		w.overtaken++
	}
}

// linOpWaitLease waits until ctx ends or a lease renewal has surely run.
func linOpWaitLease(ctx context.Context) {
	t := time.NewTimer(linOpLease / 2)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// pauseInstance stops the instance's database traffic for d, or until ctx
// ends: it holds every connection of pool, so the owner's lease renewals
// wait, and the lease may end while the owner still runs.
func pauseInstance(ctx context.Context, pool *pgxpool.Pool, d time.Duration) {
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range linOpPoolSize {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return
		}
		held = append(held, c)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// run makes calls from linOpClients instances for w.duration and returns
// the history; it closes the instances' pools before it returns.
func (w *linOpWorkload) run(ctx context.Context) ([]lincheck.OpCall, error) {
	w.start = time.Now()
	clients := make([]*linOpClient, linOpClients)
	for i := range clients {
		c, err := w.client(ctx, linOpClientApp, linOpPoolSize)
		if err != nil {
			return nil, err
		}
		defer c.pool.Close()
		clients[i] = c
	}
	var wg sync.WaitGroup
	for client, c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(w.seed, 1<<40+uint64(client)))
			var retry *linOpPlan
			for time.Since(w.start) < w.duration {
				p := w.plan(rng, retry)
				call, detail := w.call(c, client, p)
				w.record(call, detail)
				// The same instance continues an operation it left
				// unfinished half of the time; other instances find it
				// in the window.
				retry = nil
				switch call.Kind {
				case lincheck.Failed, lincheck.Unknown, lincheck.InProgress:
					if !p.resume && rng.IntN(2) == 0 {
						retry = &p
					}
				}
				if call.Kind == lincheck.InProgress {
					// As a client told 409 would, it waits a little.
					time.Sleep(time.Duration(5+rng.IntN(45)) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	return w.calls, nil
}

func (w *linOpWorkload) record(c lincheck.OpCall, detail string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, c)
	w.details[detail]++
}

func (w *linOpWorkload) plan(rng *rand.Rand, retry *linOpPlan) linOpPlan {
	p := linOpPlan{op: w.ops.Add(1), deadline: linCallBound}
	switch {
	case retry != nil:
		p.key, p.n, p.req = retry.key, retry.n, retry.req
	default:
		p.n = int(time.Since(w.start)/linOpKeyStep) + rng.IntN(linOpWindow)
		// A completer's call, with no request of its own.
		if p.resume = rng.IntN(6) == 0; p.resume {
			p.n = max(0, p.n-rng.IntN(linOpBehind))
		}
		p.key = fmt.Sprintf("o-%05d", p.n)
		variant := "main"
		if rng.IntN(10) == 0 {
			variant = "other"
		}
		p.req = linOpReq{Variant: variant, Amount: linOpAmount(p.n, variant)}
	}
	if rng.IntN(6) == 0 {
		p.deadline = time.Duration(20+rng.IntN(500)) * time.Millisecond
	}
	switch r := rng.IntN(100); {
	case r < 4:
		p.fail = "reserve"
	case r < 8:
		p.fail = "unreached"
	case r < 14:
		p.fail = "lost"
	case r < 18:
		p.fail = "receipt"
	}
	if rng.IntN(3) == 0 {
		p.pause = []string{"before", "after", "after"}[rng.IntN(3)]
		p.pauseFor = linOpLease + time.Duration(rng.IntN(int(3*linOpLease)))
	}
	p.latency = time.Duration(rng.IntN(60)) * time.Millisecond
	switch r := rng.IntN(40); {
	case r == 0:
		p.hold = linOpLease + time.Duration(rng.IntN(int(linOpLease)))
	case r < 10:
		p.hold = time.Duration(5+rng.IntN(35)) * time.Millisecond
	}
	return p
}

// call makes one call and records how it ended.
func (w *linOpWorkload) call(cl *linOpClient, client int, p linOpPlan) (lincheck.OpCall, string) {
	ctx, cancel := context.WithTimeout(context.Background(), p.deadline)
	defer cancel()
	ctx = context.WithValue(ctx, linOpPlanKey{}, &p)
	c := lincheck.OpCall{Call: lincheck.Call{Client: client, Key: p.key, Op: p.op, Start: int64(time.Since(w.start))}}
	if p.resume {
		outcome, err := cl.op.Resume(ctx, "", p.key)
		c.End = int64(time.Since(w.start))
		return c, "resume: " + w.classify(&c, p, nil, outcome, err)
	}
	c.Hash = p.req.Variant
	v, outcome, err := cl.op.Run(ctx, p.key, p.req)
	c.End = int64(time.Since(w.start))
	return c, w.classify(&c, p, &v, outcome, err)
}

// classify fills in how the call ended, from the Outcome it reported, and
// returns a finer class for the report. v is the answer a Run returned,
// nil for a Resume. What the Outcome and the error cannot both be, and
// errors the workload cannot cause, are contradictions.
func (w *linOpWorkload) classify(c *lincheck.OpCall, p linOpPlan, v *linOpAnswer, outcome idem.Outcome, err error) string {
	if err != nil {
		c.Err = err.Error()
	}
	contradict := func(format string, args ...any) {
		if c.Contradiction == "" {
			c.Contradiction = fmt.Sprintf(format, args...) + fmt.Sprintf(" (outcome %v, error %v)", outcome, err)
		}
	}
	if p.ranPastLoss {
		contradict("the owner ran on for %v after another owner took its operation over: its step's context did not end with ErrLeaseLost", linOpLostBound)
	}
	if p.leaseLost && !errors.Is(err, idem.ErrLeaseLost) {
		contradict("the owner's step's context ended with ErrLeaseLost, but the call did not report it")
	}
	var refusal *idem.Refusal
	refused := errors.As(err, &refusal)
	if refused && !errors.Is(err, errLinOpDeclined) {
		contradict("a refusal the operation does not make")
	}
	answered := func() {
		if v == nil {
			return
		}
		c.Value, c.Answer = v.Finisher, v.text()
		if v.Variant != p.req.Variant {
			contradict("the answer is for the request %q", v.Variant)
		}
	}
	switch outcome {
	case idem.OutcomeExecuted, idem.OutcomeRefused:
		c.Kind, c.Value = lincheck.Executed, c.Op
		c.Refused = outcome == idem.OutcomeRefused
		answered()
		switch {
		case v != nil && c.Refused != refused, v == nil && err != nil:
			contradict("an Outcome its error contradicts")
		case c.Value != c.Op:
			contradict("the call stored the answer, which names call %d", c.Value)
		case c.Refused != linOpDeclines(p.n):
			contradict("a refusal for a charge the provider did not decline, or none for one it did")
		}
		if c.Refused {
			return "executed (refusal)"
		}
		return "executed"
	case idem.OutcomeReplayed:
		c.Kind, c.Refused = lincheck.Replayed, refused
		answered()
		switch {
		case err != nil && !refused:
			contradict("an Outcome its error contradicts")
		case v != nil && c.Value == c.Op:
			contradict("a replay of the call's own answer")
		}
		if c.Refused {
			return "replayed (refusal)"
		}
		return "replayed"
	case idem.OutcomeInProgress:
		c.Kind = lincheck.InProgress
		if !errors.Is(err, idem.ErrInProgress) {
			contradict("an Outcome its error contradicts")
		}
		return c.Kind.String()
	case idem.OutcomeMismatch:
		c.Kind = lincheck.Mismatch
		if !errors.Is(err, idem.ErrMismatch) {
			contradict("an Outcome its error contradicts")
		}
		if v == nil {
			contradict("ErrMismatch for Resume, which runs the stored request")
		}
		return c.Kind.String()
	case idem.OutcomeUnknown:
		c.Kind = lincheck.Unknown
		// Had it stored the answer, the answer is a refusal exactly when
		// the provider declines the key's charge.
		c.Refused = linOpDeclines(p.n)
		if !errors.Is(err, idem.ErrOutcomeUnknown) {
			contradict("an Outcome its error contradicts")
		}
		return c.Kind.String()
	case idem.OutcomeFailed:
	default:
		c.Kind = lincheck.Failed
		contradict("an Outcome the workload cannot cause")
		return "failed: unexpected"
	}
	c.Kind = lincheck.Failed
	switch {
	case err == nil:
		contradict("a failure without an error")
		return "failed: unexpected"
	case errors.Is(err, idem.ErrNotFound) && v == nil:
		c.Kind = lincheck.NotFound
		return c.Kind.String()
	case errors.Is(err, idem.ErrInvalidOption), errors.Is(err, idem.ErrCorruptRecord),
		errors.Is(err, idem.ErrKeyLost), errors.Is(err, idem.ErrNotFound), errors.Is(err, idem.ErrMismatch):
		contradict("an error the workload cannot cause")
		return "failed: unexpected"
	case pgCode(err) == "23505":
		// The workload's table has no unique constraint: this is the step
		// records' primary key, hit by a second owner recording a step that
		// one owner recorded, which fencing must prevent.
		contradict("two owners recorded one step")
		return "failed: unexpected"
	case errors.Is(err, idem.ErrLeaseLost):
		return "failed: lease lost"
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return "failed: a step's outcome unknown"
	case errors.Is(err, errLinFailed):
		return "failed: step failed (" + p.fail + ")"
	case errors.Is(err, errLinOpUnreached):
		return "failed: provider unreached"
	case errors.Is(err, errLinOpAnswerLost):
		return "failed: provider's answer lost"
	case errors.Is(err, context.DeadlineExceeded):
		return "failed: deadline"
	}
	switch code := pgCode(err); code {
	case "":
		return "failed: connection"
	default:
		return "failed: SQLSTATE " + code
	}
}

// settle drives every operation key of the run to its end with Resume, as
// idemriver's completer would, once the faults stopped: until each
// finished, or was never begun. Its calls join the history.
func (w *linOpWorkload) settle(ctx context.Context) ([]lincheck.OpCall, []string, error) {
	cl, err := w.client(ctx, linOpSettleApp, linOpPoolSize)
	if err != nil {
		return nil, nil, err
	}
	defer cl.pool.Close()
	keys := map[string]int{}
	for _, c := range w.calls {
		var n int
		if _, err := fmt.Sscanf(c.Key, "o-%d", &n); err != nil {
			return nil, nil, err
		}
		keys[c.Key] = n
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	deadline := time.Now().Add(linOpSettleBound)
	var unsettled []string
	for _, k := range sorted {
		for {
			p := linOpPlan{key: k, n: keys[k], op: w.ops.Add(1), resume: true, deadline: linCallBound}
			c, detail := w.call(cl, linOpClients, p)
			w.record(c, "settle "+detail)
			w.settled++
			if c.Kind == lincheck.Executed {
				w.completed++
			}
			if c.Kind == lincheck.Executed || c.Kind == lincheck.Replayed || c.Kind == lincheck.NotFound {
				break
			}
			if time.Now().After(deadline) {
				unsettled = append(unsettled, k)
				break
			}
			// An owner that died holds its lease until it ends.
			time.Sleep(linOpLease / 4)
		}
	}
	return w.calls, unsettled, nil
}

// takeovers counts the owner runs after each key's first.
func (w *linOpWorkload) takeovers() (runs, takeovers int) {
	for _, n := range w.owners {
		runs += n
		takeovers += n - 1
	}
	return runs, takeovers
}

// staleReturns counts the step functions that returned after their owner
// lost its lease.
func (w *linOpWorkload) staleReturns() int {
	n := 0
	for _, ops := range w.fenced {
		n += len(ops)
	}
	return n
}

// ran notes that an owner of key's operation in run called the provider.
func (w *linOpWorkload) ran(key, run string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.runs[key] == nil {
		w.runs[key] = map[string]bool{}
	}
	w.runs[key][run] = true
}

// derived is the provider key of key's operation: its one run's derived
// key. A key whose owners ran in several runs has none that every effect
// could match, and each of its effects is a violation.
func (w *linOpWorkload) derived(key string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.runs[key]) != 1 {
		return fmt.Sprintf("(%d runs)", len(w.runs[key]))
	}
	for run := range w.runs[key] {
		return idem.CallKey{Key: key, Run: run}.Derive(linOpStep)
	}
	return ""
}

// readOpFinal reads every operation key's row, the step rows, and the
// provider's effects.
func readOpFinal(t *testing.T, admin *pgxpool.Pool, w *linOpWorkload) lincheck.OpFinal {
	t.Helper()
	ctx := context.Background()
	final := lincheck.OpFinal{Keys: map[string]lincheck.OpStored{}, Ledger: map[string]map[string][]int64{},
		Derived: w.derived}
	rows, err := admin.Query(ctx, `
		SELECT k.idempotency_key, k.status, k.response, o.request
		FROM idempotency_keys AS k
		LEFT JOIN idempotency_keys_operations AS o USING (scope, idempotency_key)
		WHERE k.idempotency_key LIKE 'o-%'`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		key, status       string
		response, request []byte
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &status, &response, &request}, func() error {
		s := lincheck.OpStored{Status: status}
		if status == string(idem.StatusUnfinished) {
			var req linOpReq
			if err := json.Unmarshal(request, &req); err != nil {
				t.Errorf("key %s: stored request %q: %v", key, request, err)
			}
			s.Hash = req.Variant
		} else {
			var a linOpAnswer
			if err := json.Unmarshal(response, &a); err != nil {
				t.Errorf("key %s: stored answer %q: %v", key, response, err)
			}
			s.Hash, s.Finisher, s.Refused, s.Answer, s.Effect = a.Variant, a.Finisher, status == "refused", a.text(), a.Effect
			s.Steps, s.Outputs = map[string]int64{}, map[string]int64{}
			for step, op := range map[string]int64{"reserve": a.Reserve, "receipt": a.Receipt, linOpStep: a.ChargeBy} {
				if op == 0 {
					continue
				}
				s.Outputs[step] = op
				if step != linOpStep {
					s.Steps[step] = op
				}
			}
		}
		final.Keys[key] = s
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rows, err = admin.Query(ctx, "SELECT key, step, op FROM lin_op_ledger")
	if err != nil {
		t.Fatal(err)
	}
	var (
		step string
		op   int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &step, &op}, func() error {
		if final.Ledger[key] == nil {
			final.Ledger[key] = map[string][]int64{}
		}
		final.Ledger[key][step] = append(final.Ledger[key][step], op)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys_steps").Scan(&final.StepRecords); err != nil {
		t.Fatal(err)
	}
	client, err := idem.NewClient(admin, nil)
	if err != nil {
		t.Fatal(err)
	}
	stats, err := client.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	final.Unfinished = int(stats.Unfinished)
	w.provider.mu.Lock()
	final.Effects = slices.Clone(w.provider.effects)
	w.provider.mu.Unlock()
	final.Fenced = w.fenced
	return final
}
