package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// The boundary sweep: one fault at one boundary of the charge operation
// (boundarySteps: reserve, a database step; charge, an external step at
// the processor; receipt, a database step), then the operation settled,
// either by the client's retry (Run again, same key and request) or by the
// completer alone (Resume, which idemriver's completer calls), and the
// invariants checked: each step's rows exist once (counted in tables with
// no unique constraint), the processor charged once, every answer is the
// same, nothing is left unfinished.
//
// Boundaries, for each database step (reserve, receipt):
//
//	before  before the step's transaction begins
//	inside  in the step's function, after its write, before its record
//	commit  the COMMIT that carries the step (with the next step's BEGIN,
//	        the call's fence, or the answer) reached the server; its
//	        answer is lost
//	after   the step returned, its transaction pending (its COMMIT
//	        travels with what comes next), before the next step (or, after
//	        receipt, before the answer is stored)
//
// and for the external step: before the processor acts (its before hook),
// and after it acted, its answer lost (its after hook).
//
// Faults: ctx cancel, panic, a cut connection (the fault proxy the owner's
// pool connects through), pg_terminate_backend, and SIGKILL of an owner
// process (operation_owner_test.go). Which apply where:
//
//	               ctx cancel  panic  cut  terminate  SIGKILL
//	db before          x         x     x       x         x
//	db inside          x         x     x       x         x
//	db commit          x         -     x       x         x
//	db after           x         x     x       x         x
//	provider before    x         x     x       -         x
//	provider after     x         x     x       x         x
//
// Skipped, and why:
//   - panic with COMMIT's answer lost: none of the owner's code runs while
//     COMMIT's answer is on its way; a panic just before COMMIT is the
//     "inside" boundary, one just after it the "after" boundary.
//   - pg_terminate_backend before the provider acts: no session belongs
//     to an external step; terminating the owner's idle sessions there
//     moves the fault to the record of the provider's answer, which is the
//     "provider after" row.
//
// How each fault is made:
//   - ctx cancel: the Run's context is cancelled at the boundary; with
//     COMMIT's answer lost, the proxy holds the answer back (Blackhole)
//     and cancels, so pgx gives up waiting for it.
//   - cut: the proxy cuts the connection that carries the step's BEGIN
//     (before), its record (inside), or COMMIT's answer (commit), or every
//     connection of the owner (after: the next statement meets a dead
//     connection, or a new one). At the provider, the connection to it
//     fails before it acts, or after it acted together with every
//     connection of the owner.
//   - pg_terminate_backend: inside, of the step's own backend; with
//     COMMIT's answer lost, the FATAL of a terminated backend arrives in
//     place of the answer (the proxy); before and after a step, and after
//     the provider acted, every session of the owner is terminated, and
//     the next statement meets a dead connection (or, now and then, a new
//     one, so the first call may even finish).
//   - SIGKILL: an owner process is killed at the boundary (waiting there
//     for the test, or from the proxy's rule as COMMIT's answer passes, or
//     from the processor's hook). Its lease then runs out.

// sweepLease is the operations' lease in the sweep: short, so that a
// killed owner's lease runs out soon, and long enough that a loaded
// machine does not stall a live owner's renewal (every third of it) past
// it.
const sweepLease = time.Second

type opFault string

const (
	faultCancel    opFault = "ctx cancel"
	faultPanic     opFault = "panic"
	faultCut       opFault = "cut connection"
	faultTerminate opFault = "pg_terminate_backend"
	faultKill      opFault = "SIGKILL"
)

var opFaults = []opFault{faultCancel, faultPanic, faultCut, faultTerminate, faultKill}

// An opBoundary is a point of the charge operation.
type opBoundary struct {
	step  string // reserve, charge or receipt
	where string // before, inside, commit, after (charge: before, after)
}

func (b opBoundary) String() string {
	switch {
	case b.step == "charge" && b.where == "before":
		return "charge: before the provider acts"
	case b.step == "charge":
		return "charge: provider acted, answer lost"
	case b.where == "before":
		return b.step + ": before its transaction"
	case b.where == "inside":
		return b.step + ": inside, after its write"
	case b.where == "commit":
		return b.step + ": COMMIT's answer lost"
	}
	return b.step + ": after it returned"
}

// point is the hook of boundarySteps where the fault is set off; with
// COMMIT's answer lost, the step's inside, where the proxy's rule is set.
func (b opBoundary) point() opPoint {
	where := b.where
	if where == "commit" {
		where = "inside"
	}
	return opPoint(b.step + ":" + where)
}

var opBoundaries = []opBoundary{
	{"reserve", "before"}, {"reserve", "inside"}, {"reserve", "commit"}, {"reserve", "after"},
	{"charge", "before"}, {"charge", "after"},
	{"receipt", "before"}, {"receipt", "inside"}, {"receipt", "commit"}, {"receipt", "after"},
}

// skipped says why fault f is not run at b, or "".
func skipped(b opBoundary, f opFault) string {
	switch {
	case f == faultPanic && b.where == "commit":
		return "no code of the owner runs while COMMIT's answer is on its way"
	case f == faultTerminate && b.step == "charge" && b.where == "before":
		return "no session belongs to an external step; the fault would land on the record of the provider's answer (provider after)"
	}
	return ""
}

// mayFinish reports whether the first call may finish despite f at b: the
// fault hit connections the call may not use again (it dials a new one).
func mayFinish(b opBoundary, f opFault) bool {
	switch f {
	case faultCut:
		return b.where == "after" && b.step != "charge"
	case faultTerminate:
		return b.where == "before" || b.where == "after"
	}
	return false
}

// providerCalls is how many calls the processor gets in all, the fault's
// call and the settling one: two when the fault struck around the
// provider's call (the second with the same derived key), one when the
// call's answer was recorded before the fault, or the fault came before
// the call and stopped it, and either when it is not known which
// connection the fault's call used. The call's answer is recorded in the
// receipt's transaction, which commits with the answer: an owner killed
// around the receipt loses it, and so does a pending receipt whose
// connection the fault ends; an owner that stops on an error records it
// before it stops.
func providerCalls(b opBoundary, f opFault) (lo, hi int) {
	switch {
	case b.step == "receipt" && b.where != "commit" && f == faultKill:
		return 2, 2
	case b.step == "receipt" && b.where == "after" && (f == faultCut || f == faultTerminate):
		return 2, 2
	case b.step == "charge" && f == faultTerminate:
		return 1, 2
	case b.step == "charge":
		return 2, 2
	case b.step == "reserve" && mayFinish(b, f):
		return 1, 2
	}
	return 1, 1
}

// The two ways to settle an operation after a fault.
const (
	byRetry     = "client retry"
	byCompleter = "completer"
)

// sweepCase is one subtest of the sweep.
type sweepCase struct {
	b      opBoundary
	f      opFault
	settle string
}

func (c sweepCase) name() string {
	return strings.NewReplacer(" ", "_", ":", "", "'", "", ",", "").Replace(
		fmt.Sprintf("%s/%s/%s/%s", c.b.step, c.b.where, c.f, c.settle))
}

// sweepRow is one line of the sweep's table.
type sweepRow struct {
	c            sweepCase
	first        string // how the faulty call ended
	settled      string // the settling calls' outcomes
	calls        int    // the processor's calls
	charged      int    // its distinct charges
	reservations int
	receipts     int
	result       string
}

// sweepTable collects the rows of the subtests of one sweep.
type sweepTable struct {
	mu   sync.Mutex
	rows []sweepRow
}

func (st *sweepTable) add(r sweepRow) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.rows = append(st.rows, r)
}

// String is the table in Markdown, in the order of the cases.
func (st *sweepTable) String() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	var b strings.Builder
	b.WriteString("\n| boundary | fault | settled by | first call | settling calls | provider calls | charges | reservations | receipts | result |\n")
	b.WriteString("|---|---|---|---|---|---:|---:|---:|---:|---|\n")
	for _, r := range st.rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d | %d | %d | %d | %s |\n",
			r.c.b, r.c.f, r.c.settle, r.first, r.settled, r.calls, r.charged, r.reservations, r.receipts, r.result)
	}
	return b.String()
}

// TestOperationBoundarySweep runs one fault at each boundary, settled by
// the client's retry at some and by the completer at others, every fault
// at least once: the quick part of the sweep, for make test.
// TestOperationBoundarySweepLong runs the whole matrix.
func TestOperationBoundarySweep(t *testing.T) {
	cases := []sweepCase{
		{opBoundary{"reserve", "before"}, faultCancel, byCompleter},
		{opBoundary{"reserve", "inside"}, faultTerminate, byRetry},
		{opBoundary{"reserve", "commit"}, faultCut, byCompleter},
		{opBoundary{"reserve", "after"}, faultKill, byRetry},
		{opBoundary{"charge", "before"}, faultPanic, byCompleter},
		{opBoundary{"charge", "after"}, faultKill, byCompleter},
		{opBoundary{"receipt", "before"}, faultCut, byRetry},
		{opBoundary{"receipt", "inside"}, faultPanic, byRetry},
		{opBoundary{"receipt", "commit"}, faultTerminate, byRetry},
		{opBoundary{"receipt", "after"}, faultCancel, byCompleter},
	}
	runSweep(t, cases)
}

// TestOperationBoundarySweepLong runs every boundary with every fault that
// applies there, each settled once by the client's retry and once by the
// completer alone.
func TestOperationBoundarySweepLong(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("the whole boundary sweep (94 cases) runs with IDEM_TEST_LONG=1 (make test-long)")
	}
	var cases []sweepCase
	for _, b := range opBoundaries {
		for _, f := range opFaults {
			if skipped(b, f) != "" {
				continue
			}
			for _, by := range []string{byRetry, byCompleter} {
				cases = append(cases, sweepCase{b, f, by})
			}
		}
	}
	runSweep(t, cases)
}

// runSweep runs cases on one database, each with a key, a processor, a
// fault proxy and owners of its own, and logs the table of their results.
func runSweep(t *testing.T, cases []sweepCase) {
	db := newOpSetup(t, nil)
	table := &sweepTable{}
	t.Run("cases", func(t *testing.T) {
		for i, c := range cases {
			t.Run(c.name(), func(t *testing.T) {
				t.Parallel()
				r := rigOn(t, db.pool, db.client, fmt.Sprintf("idem-owner-%d", i), sweepLease)
				runSweepCase(t, r, fmt.Sprintf("k-sweep-%d", i), c, table)
			})
		}
	})
	if n := db.unfinished(); n != 0 {
		t.Errorf("%d unfinished rows in the database after the sweep", n)
	}
	// The rows in the order of the cases, not of their ends.
	order := map[sweepCase]int{}
	for i, c := range cases {
		order[c] = i
	}
	sort.Slice(table.rows, func(i, j int) bool { return order[table.rows[i].c] < order[table.rows[j].c] })
	t.Log(table)
	for _, b := range opBoundaries {
		for _, f := range opFaults {
			if why := skipped(b, f); why != "" {
				t.Logf("not run: %s at %s: %s", f, b, why)
			}
		}
	}
}

// errProviderCut is the error of a connection to the processor cut by the
// sweep.
var errProviderCut = errors.New("the connection to the processor was cut")

// sweepPanic is what the sweep's panics throw.
const sweepPanic = "the sweep's panic"

func runSweepCase(t *testing.T, r *opRig, key string, c sweepCase, table *sweepTable) {
	row := sweepRow{c: c}
	const amount = 500
	req := chargeReq{Amount: amount}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	defer func() {
		row.calls, row.charged = r.proc.callCount(), r.proc.charged()
		row.reservations, row.receipts = r.rowsOf(key)
		row.result = "ok"
		if t.Failed() {
			row.result = "FAILED"
		}
		table.add(row)
	}()

	// The owner's pool connects through the proxy. The client's retry runs
	// on such a pool too: the owner's own (with the connections the fault
	// left), or a new process's after SIGKILL. The completer is another
	// process, on a pool of its own.
	ownerDB := r.ownerPool()
	var fired atomic.Bool
	fire := func() bool { return fired.CompareAndSwap(false, true) }
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	var killed atomic.Pointer[ownerProcess]

	if c.b.step == "charge" {
		hook := func(hctx context.Context, _ string) error {
			if !fire() {
				return nil
			}
			switch c.f {
			case faultCancel:
				cancelRun()
				if err := hctx.Err(); err != nil {
					return err
				}
				return context.Canceled
			case faultPanic:
				panic(sweepPanic)
			case faultCut:
				if c.b.where == "after" {
					r.proxy.CutAll()
				}
				return errProviderCut
			case faultTerminate:
				if err := r.terminateOwners(ctx); err != nil {
					t.Error(err)
				}
				return nil
			case faultKill:
				for killed.Load() == nil {
					time.Sleep(time.Millisecond)
				}
				killed.Load().kill()
				return errors.New("the owner was killed")
			}
			return nil
		}
		if c.b.where == "before" {
			r.proc.before = hook
		} else {
			r.proc.after = hook
		}
	}

	var (
		owner   *idem.Operation[chargeReq, chargeResp]
		answers []chargeResp // every answer a call gave
	)
	if c.f == faultKill {
		row.first = "killed"
		owner = r.op(ownerDB, nil, noHooks)
		stop := opPoint("")
		if c.b.step != "charge" {
			stop = c.b.point()
		}
		proc := r.owner(key, amount, stop, 0)
		killed.Store(proc)
		switch {
		case c.b.step == "charge":
		case c.b.where == "commit":
			proc.reach(stop)
			r.proxy.SetRule(func(m faultproxy.Message) faultproxy.Action {
				if isCommitAnswer(m) && fire() {
					proc.kill()
					return faultproxy.CutBefore
				}
				return faultproxy.Pass
			})
			proc.proceed()
		default:
			proc.reach(stop)
			fire()
			proc.kill()
		}
		proc.killed()
	} else {
		owner = r.op(ownerDB, nil, func(hctx context.Context, point opPoint, tx pgx.Tx) error {
			if point != c.b.point() || c.b.step == "charge" || !fire() {
				return nil
			}
			return r.inject(ctx, hctx, c, tx, cancelRun)
		})
		resp, outcome, panicked, err := runRecovering(runCtx, owner, key, req)
		switch {
		case panicked != nil:
			if panicked != sweepPanic {
				t.Fatalf("the first call panicked with %v", panicked)
			}
			row.first = "panic"
		case err != nil:
			row.first = fmt.Sprintf("%s (%s)", outcome, errClass(err))
		default:
			row.first = outcome.String()
			if !mayFinish(c.b, c.f) {
				t.Fatalf("the first call finished (%v, %+v) through a fault that must stop it", outcome, resp)
			}
		}
		if err == nil && panicked == nil {
			answers = append(answers, resp)
		}
		// A call stopped by its ctx before COMMIT's answer was due knows
		// that nothing is in doubt.
		if c.f == faultCancel && c.b.where != "commit" &&
			(outcome != idem.OutcomeFailed || !errors.Is(err, context.Canceled) || errors.Is(err, idem.ErrOutcomeUnknown)) {
			t.Fatalf("the call whose ctx ended: %v, %v; want failed with ctx's error", outcome, err)
		}
	}
	r.proxy.SetRule(nil)
	if !fired.Load() {
		t.Fatalf("the fault never fired at %s", c.b)
	}

	completer := r.op(r.pool, nil, noHooks)
	var (
		answer chargeResp
		trail  []string
	)
	if c.settle == byRetry {
		answer, trail = r.settleBy(ctx, c.settle, owner, key, req)
	} else {
		_, trail = r.settleBy(ctx, c.settle, completer, key, req)
		var outcome idem.Outcome
		var err error
		if answer, outcome, err = completer.Run(ctx, key, req); err != nil || outcome != idem.OutcomeReplayed {
			t.Fatalf("the client's call after the completer: %v, %v; want the answer replayed", outcome, err)
		}
	}
	row.settled = strings.Join(trail, ", ")
	// An owner that stopped on a panic or on its ctx frees the operation
	// as it stops: the settling call need not wait out the lease.
	if freed := c.f == faultPanic || c.f == faultCancel && c.b.where != "commit"; freed && strings.HasPrefix(trail[0], idem.OutcomeInProgress.String()) {
		t.Fatalf("after the owner stopped on %s, the settling calls were %v: it did not free the operation", c.f, trail)
	}
	lo, hi := providerCalls(c.b, c.f)
	r.settledOnce(key, amount, lo, hi, append(answers, answer)...)
}

// inject sets off fault c.f at its boundary, from inside the operation:
// hctx is the step's context, tx the step's transaction (inside a step).
func (r *opRig) inject(ctx, hctx context.Context, c sweepCase, tx pgx.Tx, cancelRun context.CancelFunc) error {
	switch c.f {
	case faultCancel:
		if c.b.where == "commit" {
			// COMMIT's answer held back, and the call given up meanwhile.
			r.proxy.SetRule(onceRule(isCommitAnswer, func() faultproxy.Action {
				cancelRun()
				return faultproxy.Blackhole
			}))
			return nil
		}
		cancelRun()
	case faultPanic:
		panic(sweepPanic)
	case faultCut:
		switch c.b.where {
		case "before":
			r.proxy.SetRule(faultproxy.Once(faultproxy.ClientSQL("begin"), faultproxy.CutBefore))
		case "inside":
			r.proxy.SetRule(faultproxy.Once(faultproxy.ClientSQLContains("operation_record:"), faultproxy.CutBefore))
		case "commit":
			r.proxy.SetRule(faultproxy.Once(isCommitAnswer, faultproxy.CutBefore))
		case "after":
			r.proxy.CutAll()
		}
	case faultTerminate:
		switch c.b.where {
		case "inside":
			var pid int
			if err := tx.QueryRow(hctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			if _, err := r.pool.Exec(ctx, "SELECT pg_terminate_backend($1, 10000)", pid); err != nil {
				r.t.Error(err)
			}
		case "commit":
			r.proxy.SetRule(faultproxy.Once(isCommitAnswer, faultproxy.FatalBefore))
		default:
			if err := r.terminateOwners(ctx); err != nil {
				r.t.Error(err)
			}
		}
	}
	return nil
}

// isCommitAnswer selects COMMIT's answer.
var isCommitAnswer = faultproxy.ServerTag("COMMIT")

// onceRule answers act() for the first message match selects.
func onceRule(match faultproxy.Match, act func() faultproxy.Action) faultproxy.Rule {
	done := false
	return func(m faultproxy.Message) faultproxy.Action {
		if !done && match(m) {
			done = true
			return act()
		}
		return faultproxy.Pass
	}
}

// runRecovering runs op and returns the panic it threw, if any.
func runRecovering(ctx context.Context, op *idem.Operation[chargeReq, chargeResp], key string, req chargeReq) (resp chargeResp, outcome idem.Outcome, panicked any, err error) {
	defer func() { panicked = recover() }()
	resp, outcome, err = op.Run(ctx, key, req)
	return resp, outcome, nil, err
}

// errClass names what err is, briefly, for the table.
func errClass(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return "outcome unknown"
	case errors.Is(err, context.Canceled):
		return "ctx canceled"
	case errors.Is(err, idem.ErrLeaseLost):
		return "lease lost"
	case errors.Is(err, errProviderCut):
		return "provider cut"
	case errors.As(err, &pgErr):
		return "SQLSTATE " + pgErr.Code
	case idem.Retryable(err):
		return "connection lost"
	}
	return err.Error()
}

// settleBy drives key's operation to its end by the client's retry (Run
// with the same key and request) or the completer (Resume), calling again
// while the operation is in progress (a killed owner's lease has not run
// out, or its backend has not yet noticed) or the call failed with a
// retryable error (a pooled connection that a fault left dead). It returns
// the answer (a retry's) and the outcome of each call.
func (r *opRig) settleBy(ctx context.Context, by string, op *idem.Operation[chargeReq, chargeResp], key string, req chargeReq) (chargeResp, []string) {
	r.t.Helper()
	var trail []string
	for range 100 {
		var (
			resp    chargeResp
			outcome idem.Outcome
			err     error
		)
		if by == byRetry {
			resp, outcome, err = op.Run(ctx, key, req)
		} else {
			outcome, err = op.Resume(ctx, "", key)
		}
		trail = append(trail, outcome.String())
		if err == nil && (outcome == idem.OutcomeExecuted || outcome == idem.OutcomeReplayed) {
			return resp, squeeze(trail)
		}
		if outcome != idem.OutcomeInProgress && !idem.Retryable(err) {
			r.t.Fatalf("%s: %v, %v (calls so far: %v)", by, outcome, err, trail)
		}
		time.Sleep(r.lease / 3)
	}
	r.t.Fatalf("%s: the operation did not settle: %v", by, squeeze(trail))
	return chargeResp{}, nil
}

// squeeze writes runs of one outcome as "outcome×n".
func squeeze(trail []string) []string {
	var out []string
	for i := 0; i < len(trail); {
		j := i
		for j < len(trail) && trail[j] == trail[i] {
			j++
		}
		if j-i > 1 {
			out = append(out, fmt.Sprintf("%s×%d", trail[i], j-i))
		} else {
			out = append(out, trail[i])
		}
		i = j
	}
	return out
}

// settledOnce asserts what a settled operation under key leaves: one
// reservation and one receipt, one charge at the processor from lo to hi
// calls, the receipt naming the charge, answers all equal to a replay, and
// nothing unfinished.
func (r *opRig) settledOnce(key string, amount int64, lo, hi int, answers ...chargeResp) {
	r.t.Helper()
	if res, rec := r.rowsOf(key); res != 1 || rec != 1 {
		r.t.Fatalf("key %s: %d reservations, %d receipts; want 1 each", key, res, rec)
	}
	if n, calls := r.proc.charged(), r.proc.callCount(); n != 1 || calls < lo || calls > hi {
		r.t.Fatalf("key %s: %d charges from %d processor calls; want 1 charge from %d to %d calls", key, n, calls, lo, hi)
	}
	replay := r.sameAnswers(key, amount, answers...)
	if want := (chargeResp{ChargeID: "ch_1", Amount: amount}); replay != want {
		r.t.Fatalf("key %s: the answer is %+v, want %+v", key, replay, want)
	}
	if id := r.receiptOf(key); id != replay.ChargeID {
		r.t.Fatalf("key %s: the receipt names charge %q, the answer %q", key, id, replay.ChargeID)
	}
	if n := r.unfinished(key); n != 0 {
		r.t.Fatalf("key %s: %d unfinished rows after the operation settled", key, n)
	}
	if st := r.steps(key); len(st) != 0 {
		r.t.Fatalf("key %s: steps %v left after the operation finished", key, st)
	}
}

// sameAnswers replays key's answer to a charge of amount and asserts that
// each answer equals it.
func (r *opRig) sameAnswers(key string, amount int64, answers ...chargeResp) chargeResp {
	r.t.Helper()
	op := r.op(r.pool, nil, noHooks)
	replay, outcome, err := op.Run(context.Background(), key, chargeReq{Amount: amount})
	if err != nil || outcome != idem.OutcomeReplayed {
		r.t.Fatalf("replay of %s: %v, %v", key, outcome, err)
	}
	for i, a := range answers {
		if a != replay {
			r.t.Fatalf("key %s: answer %d is %+v, the replay %+v", key, i, a, replay)
		}
	}
	return replay
}

// receiptOf returns the charge id of key's receipt.
func (r *opRig) receiptOf(key string) string {
	r.t.Helper()
	var id string
	if err := r.pool.QueryRow(context.Background(), "SELECT charge_id FROM op_receipts WHERE key = $1", key).Scan(&id); err != nil {
		r.t.Fatal(err)
	}
	return id
}
