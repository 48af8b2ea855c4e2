package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/lincheck"
)

// The workload's shape.
const (
	linClients  = 16
	linPoolSize = 4 // fewer connections than clients: calls queue for one
	// A new key every linKeyStep; each call picks one of the linWindow
	// keys from the current step on, so every key sees a burst of concurrent
	// first attempts, then replays.
	linKeyStep = 100 * time.Millisecond
	linWindow  = 5
	// linCallBound bounds a call that draws no short deadline.
	linCallBound = 30 * time.Second
)

// linValue is what fn returns and Do stores: the operation that ran.
type linValue struct {
	Op int64 `json:"op"`
}

var (
	errLinDeclined = idem.Refuse("declined", "declined on purpose")
	errLinFailed   = errors.New("fn failed on purpose")
)

// linWorkload is one run's clients and what they recorded.
type linWorkload struct {
	pool        *pgxpool.Pool
	partitioned bool
	seed        uint64
	duration    time.Duration

	start time.Time
	ops   atomic.Int64
	mu    sync.Mutex
	calls []lincheck.Call
	// details counts the calls by a finer class than lincheck.Kind, for the
	// report.
	details map[string]int
}

// run makes calls from linClients goroutines for w.duration and returns the
// history.
func (w *linWorkload) run() []lincheck.Call {
	w.start = time.Now()
	w.details = map[string]int{}
	var wg sync.WaitGroup
	for client := range linClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(w.seed, uint64(client)))
			for time.Since(w.start) < w.duration {
				c, detail := w.call(rng, client)
				w.mu.Lock()
				w.calls = append(w.calls, c)
				w.details[detail]++
				w.mu.Unlock()
			}
		})
	}
	wg.Wait()
	return w.calls
}

// linPlan is what one call does, drawn before it starts.
type linPlan struct {
	key, hash string
	op        int64
	behave    int // linSucceed, linRefuse, linFail
	hold      time.Duration
	deadline  time.Duration
	iso       pgx.TxIsoLevel
	wait      time.Duration
	useRun    bool
}

const (
	linSucceed = iota
	linRefuse
	linFail
)

func (w *linWorkload) plan(rng *rand.Rand) linPlan {
	n := int(time.Since(w.start)/linKeyStep) + rng.IntN(linWindow)
	p := linPlan{key: fmt.Sprintf("k-%05d", n), op: w.ops.Add(1), useRun: rng.IntN(2) == 0, deadline: linCallBound}
	p.hash = "h-" + p.key
	if rng.IntN(10) == 0 {
		p.hash += "-other"
	}
	switch r := rng.IntN(100); {
	case r < 10:
		p.behave = linRefuse
	case r < 20:
		p.behave = linFail
	}
	if rng.IntN(4) == 0 {
		p.hold = time.Duration(5+rng.IntN(35)) * time.Millisecond
	}
	if rng.IntN(8) == 0 {
		p.deadline = time.Duration(5+rng.IntN(55)) * time.Millisecond
	}
	levels := []pgx.TxIsoLevel{"", pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	p.iso = levels[rng.IntN(len(levels))]
	if w.partitioned {
		// There SERIALIZABLE keeps a key unique only if every call of the
		// key runs at SERIALIZABLE (docs/SCALING.md): a third of the keys
		// do, the others never use it. REPEATABLE READ is refused before
		// anything is sent: one call in ten asks for it.
		p.iso = levels[rng.IntN(2)]
		if n%3 == 0 {
			p.iso = pgx.Serializable
		}
		if rng.IntN(10) == 0 {
			p.iso = pgx.RepeatableRead
		}
	}
	if rng.IntN(5) == 0 {
		p.wait = time.Duration(20+rng.IntN(180)) * time.Millisecond
	}
	return p
}

// call makes one call and records how it ended.
func (w *linWorkload) call(rng *rand.Rand, client int) (lincheck.Call, string) {
	p := w.plan(rng)
	fn := func(ctx context.Context, tx pgx.Tx) (linValue, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO lin_ledger (key, op) VALUES ($1, $2)", p.key, p.op); err != nil {
			return linValue{}, err
		}
		if p.hold > 0 {
			if _, err := tx.Exec(ctx, "SELECT pg_sleep($1::float8)", p.hold.Seconds()); err != nil {
				return linValue{}, err
			}
		}
		switch p.behave {
		case linRefuse:
			return linValue{Op: p.op}, errLinDeclined
		case linFail:
			return linValue{}, errLinFailed
		}
		return linValue{Op: p.op}, nil
	}
	opts := []idem.Option{}
	if p.iso != "" {
		opts = append(opts, idem.WithTxOptions(pgx.TxOptions{IsoLevel: p.iso}))
	}
	if p.wait > 0 {
		opts = append(opts, idem.WithWait(p.wait))
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.deadline)
	defer cancel()

	c := lincheck.Call{Client: client, Key: p.key, Hash: p.hash, Op: p.op, Start: int64(time.Since(w.start))}
	var (
		v       linValue
		outcome idem.Outcome
		err     error
	)
	if p.useRun {
		v, outcome, err = idem.Run(ctx, w.pool, p.key, p.hash, fn, opts...)
	} else {
		v, err = idem.Do(ctx, w.pool, p.key, p.hash, func(tx pgx.Tx) (linValue, error) { return fn(ctx, tx) }, opts...)
	}
	c.End = int64(time.Since(w.start))
	detail := w.classify(&c, p, v, err)
	if p.useRun {
		if want := linOutcomes(c.Kind); want != nil && !want[outcome] {
			c.Contradiction = fmt.Sprintf("Run returned outcome %v for a call that ended %s (%v)", outcome, c.Kind, err)
		}
	}
	return c, detail
}

// classify fills in how the call ended and returns a finer class for the
// report.
func (w *linWorkload) classify(c *lincheck.Call, p linPlan, v linValue, err error) string {
	if err != nil {
		c.Err = err.Error()
	}
	var refusal *idem.Refusal
	switch {
	case err == nil || errors.As(err, &refusal):
		c.Refused = err != nil
		c.Value = v.Op
		c.Kind = lincheck.Replayed
		if v.Op == c.Op {
			c.Kind = lincheck.Executed
		}
		if v.Op == 0 {
			c.Contradiction = fmt.Sprintf("the call returned no value (err %v)", err)
		}
		if c.Refused {
			return c.Kind.String() + " (refusal)"
		}
		return c.Kind.String()
	case errors.Is(err, idem.ErrOutcomeUnknown):
		c.Kind = lincheck.Unknown
		// Had it committed, it committed what its fn returns.
		c.Refused = p.behave == linRefuse
		return c.Kind.String()
	case errors.Is(err, idem.ErrMismatch):
		c.Kind = lincheck.Mismatch
		return c.Kind.String()
	case errors.Is(err, idem.ErrInProgress):
		c.Kind = lincheck.InProgress
		return c.Kind.String()
	}
	c.Kind = lincheck.Failed
	switch {
	case errors.Is(err, idem.ErrInvalidOption) && w.partitioned && p.iso == pgx.RepeatableRead:
		return "failed: REPEATABLE READ refused on the partitioned layout"
	case errors.Is(err, idem.ErrInvalidOption), errors.Is(err, idem.ErrKeyLost), errors.Is(err, idem.ErrCorruptRecord):
		// fn never touches the key table, and the workload's options are
		// all valid: these mean the protocol let two calls hold one key, or
		// read back what it did not write.
		c.Contradiction = "an error the workload cannot cause: " + c.Err
		return "failed: unexpected"
	case errors.Is(err, errLinFailed):
		return "failed: fn failed"
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

// linOutcomes is the set of Outcomes Run may report for a call that ended
// as k.
func linOutcomes(k lincheck.Kind) map[idem.Outcome]bool {
	switch k {
	case lincheck.Executed:
		return map[idem.Outcome]bool{idem.OutcomeExecuted: true, idem.OutcomeRefused: true}
	case lincheck.Replayed:
		return map[idem.Outcome]bool{idem.OutcomeReplayed: true}
	case lincheck.Unknown:
		return map[idem.Outcome]bool{idem.OutcomeUnknown: true}
	case lincheck.Mismatch:
		return map[idem.Outcome]bool{idem.OutcomeMismatch: true}
	case lincheck.InProgress:
		return map[idem.Outcome]bool{idem.OutcomeInProgress: true}
	default:
		return map[idem.Outcome]bool{idem.OutcomeFailed: true, idem.OutcomeInvalid: true}
	}
}
