package integration_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// An owner stopped (SIGSTOP) past its lease between steps loses the
// operation to the next caller, and once resumed (SIGCONT) records
// nothing: its next record, whichever it is (the external step's, the
// database step's fence, the answer), matches the token no more, and its
// Run fails with ErrLeaseLost. The caller that took over holds the
// operation unfinished while the stale owner resumes, so that every record
// the stale owner tries meets a live operation that is not its own.
//
// Renewing, the resumed owner may learn of its loss from its first
// renewal before it tries a record; with its renewals lost (the proxy cuts
// them), it goes on to the record, which the token alone must refuse.
//
// The cases share a database, each with its own key.
func TestOperationPausedOwnerRecordsNothing(t *testing.T) {
	t.Parallel()
	db := newOpSetup(t, nil)
	n := 0
	for _, renewals := range []string{"renewing", "renewals_lost"} {
		for _, stop := range []opPoint{reserveAfter, receiptBefore, receiptAfter} {
			n++
			app, key := fmt.Sprintf("idem-owner-%d", n), fmt.Sprintf("k-paused-%d", n)
			// Two seconds: a renewing owner renews every third of a lease,
			// and with its renewals cut only its steps' statements renew
			// it; either way it must reach its stop however slow the
			// machine.
			const lease = 2 * time.Second
			t.Run(renewals+"/"+string(stop), func(t *testing.T) {
				t.Parallel()
				pausedOwner(t, rigOn(t, db.pool, db.client, app, lease), key, stop, renewals == "renewals_lost")
			})
		}
	}
}

func pausedOwner(t *testing.T, r *opRig, key string, stop opPoint, renewalsLost bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const amount = 300
	req := chargeReq{Amount: amount}
	if renewalsLost {
		renew := faultproxy.ClientSQLContains("operation_renew:")
		r.proxy.SetRule(func(m faultproxy.Message) faultproxy.Action {
			if renew(m) {
				return faultproxy.CutBefore
			}
			return faultproxy.Pass
		})
	}

	a := r.owner(key, amount, stop, 0)
	a.reach(stop)
	staleToken, _ := r.token(key)
	a.signal(syscall.SIGSTOP)
	r.leaseEnded(ctx, key)

	// The next caller takes over and stops before storing the answer.
	b, reached, release := r.heldAt(receiptAfter)
	done := runPast(ctx, b, key, req)
	select {
	case <-reached:
	case res := <-done:
		t.Fatalf("the next caller ended (%v, %v) instead of taking the operation over", res.outcome, res.err)
	}
	token, attempts := r.token(key)
	if token == staleToken || attempts != 2 {
		t.Fatalf("after the takeover: token %d (the paused owner's %d), attempts %d; want a new token, 2 attempts", token, staleToken, attempts)
	}
	// The caller that took over may commit its pending step meanwhile
	// (Steps' timer): only the records under the paused owner's token
	// must not change.
	mine := func() []string {
		return slices.DeleteFunc(r.steps(key), func(s string) bool { return !strings.HasSuffix(s, "@"+strconv.FormatInt(staleToken, 10)) })
	}
	steps := mine()

	a.signal(syscall.SIGCONT)
	a.proceed()
	stale := a.result()
	if stale.Outcome != idem.OutcomeFailed.String() || !stale.LeaseLost {
		t.Fatalf("the resumed owner: %+v; want failed with ErrLeaseLost", stale)
	}
	if now := mine(); !slices.Equal(now, steps) {
		t.Fatalf("the resumed owner changed the steps recorded under its token from %v to %v", steps, now)
	}
	// The caller that took over is held with its receipt step pending:
	// its timer commits the step within a third of its lease, however
	// slow the machine. Never more than one of each, meanwhile.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		res, rec := r.rowsOf(key)
		if res == 1 && rec == 1 {
			break
		}
		if res > 1 || rec > 1 || time.Now().After(deadline) {
			t.Fatalf("after the resumed owner: %d reservations, %d receipts; want 1 each", res, rec)
		}
	}

	close(release)
	res := <-done
	if res.err != nil || res.outcome != idem.OutcomeExecuted {
		t.Fatalf("the caller that took over: %v, %v", res.outcome, res.err)
	}
	// Stopped before the charge, the resumed owner calls nothing: the
	// fence before the external call (operation_call.sql) refuses its token, if
	// its renewal has not told it first. The processor is called once,
	// by the owner that took over. Stopped after the charge, the paused
	// owner held the charge's output for its next commit (the receipt's),
	// which never came: the owner that took over calls again with the same
	// key, and the processor charges once. Stopped with the receipt
	// pending, the paused owner may have committed it first (its timer,
	// a third of the lease after the step), the charge's record with it.
	lo, hi := 1, 1
	switch stop {
	case receiptBefore:
		lo, hi = 2, 2
	case receiptAfter:
		hi = 2
	}
	r.settledOnce(key, amount, lo, hi, res.resp)
}

// No takeover happens while the owner is inside a database step, however
// long past its lease it stays there: the step's transaction holds the
// operation's row, and operation_take.sql's NOWAIT answers ErrInProgress. The
// owner, resumed, still owns the operation and finishes it.
func TestOperationNoTakeoverInsideAStep(t *testing.T) {
	t.Parallel()
	r := newOpRig(t, sweepLease)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key, amount = "k-inside", 400
	req := chargeReq{Amount: amount}

	a := r.owner(key, amount, reserveInside, 0)
	a.reach(reserveInside)
	a.signal(syscall.SIGSTOP)
	token, attempts := r.token(key)
	r.leaseEnded(ctx, key)

	other := r.op(r.pool, nil, noHooks)
	for range 3 {
		// A takeover that waited for the step instead would hang here.
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_, outcome, err := other.Run(cctx, key, req)
		if outcome != idem.OutcomeInProgress || !errors.Is(err, idem.ErrInProgress) {
			ccancel()
			t.Fatalf("a call while the owner is inside a step, past its lease: %v, %v; want ErrInProgress", outcome, err)
		}
		outcome, err = other.Resume(cctx, "", key)
		ccancel()
		if outcome != idem.OutcomeInProgress || !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("the completer while the owner is inside a step, past its lease: %v, %v; want ErrInProgress", outcome, err)
		}
		if tok, att := r.token(key); tok != token || att != attempts {
			t.Fatalf("token %d, attempts %d; the owner's are %d, %d: taken over inside a step", tok, att, token, attempts)
		}
		time.Sleep(r.lease / 2)
	}
	if n := r.proc.callCount(); n != 0 {
		t.Fatalf("%d processor calls while the owner was stopped in its first step", n)
	}

	a.signal(syscall.SIGCONT)
	a.proceed()
	res := a.result()
	if res.Outcome != idem.OutcomeExecuted.String() {
		t.Fatalf("the resumed owner: %+v; want executed, nobody having taken over", res)
	}
	r.settledOnce(key, amount, 1, 1, res.Resp)
}

// An owner stopped inside a database step holds it only until the server
// ends its idle transaction (Config.IdleTimeout): the step rolls back,
// with its write, and the operation is taken over once the lease ran out.
// The owner, resumed, records nothing; the step's write exists once, the
// new owner's.
func TestOperationPausedStepRollsBack(t *testing.T) {
	t.Parallel()
	r := newOpRig(t, sweepLease)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key, amount = "k-rolled-back", 600
	req := chargeReq{Amount: amount}

	a := r.owner(key, amount, reserveInside, 500*time.Millisecond)
	a.reach(reserveInside)
	a.signal(syscall.SIGSTOP)
	for r.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND application_name = $1 AND state LIKE 'idle in transaction%'`, r.app) != 0 {
		if ctx.Err() != nil {
			t.Fatal("the paused owner's transaction outlived its idle timeout")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res, _ := r.rowsOf(key); res != 0 {
		t.Fatalf("%d reservations once the paused step's session ended; want its write rolled back", res)
	}

	answer, trail := r.settleBy(ctx, byRetry, r.op(r.pool, nil, noHooks), key, req)
	t.Logf("the next caller: %v", trail)

	a.signal(syscall.SIGCONT)
	a.proceed()
	if res := a.result(); res.Outcome != idem.OutcomeFailed.String() {
		t.Fatalf("the resumed owner: %+v; want failed", res)
	}
	r.settledOnce(key, amount, 1, 1, answer)
}

// After an owner stopped, 32 callers at once retry the key: one takes the
// operation over and finishes it, the others get ErrInProgress, and none
// of them runs the operation again: the processor is called twice in all
// (the failed call and the takeover's, with one key), and charges once.
func TestOperationTakeoverStorm(t *testing.T) {
	t.Parallel()
	r := newOpRig(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key, amount, callers = "k-storm", 700, 32
	req := chargeReq{Amount: amount}
	var (
		down    atomic.Bool
		runs    atomic.Int32
		release = make(chan struct{})
	)
	r.proc.before = func(hctx context.Context, _ string) error {
		if down.CompareAndSwap(false, true) {
			return errors.New("the processor is down")
		}
		select {
		case <-release:
			return nil
		case <-hctx.Done():
			return hctx.Err()
		}
	}
	op := r.op(r.pool, nil, func(_ context.Context, point opPoint, _ pgx.Tx) error {
		if point == reserveBefore {
			runs.Add(1)
		}
		return nil
	})
	if _, outcome, err := op.Run(ctx, key, req); outcome != idem.OutcomeFailed || err == nil {
		t.Fatalf("the first call: %v, %v; want failed", outcome, err)
	}

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[idem.Outcome]int{}
		answers  []chargeResp
	)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := runOp(ctx, op, key, req)
			mu.Lock()
			defer mu.Unlock()
			outcomes[res.outcome]++
			if res.err == nil {
				answers = append(answers, res.resp)
			} else if !errors.Is(res.err, idem.ErrInProgress) {
				t.Errorf("a caller: %v, %v", res.outcome, res.err)
			}
		}()
	}
	// The others answer while the one that took over waits at the
	// processor; a caller that ends otherwise fails the test below.
	for wait := time.Now().Add(30 * time.Second); time.Now().Before(wait); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := 0
		for _, k := range outcomes {
			n += k
		}
		mu.Unlock()
		if n >= callers-1 {
			break
		}
	}
	close(release)
	wg.Wait()
	if outcomes[idem.OutcomeExecuted] != 1 || outcomes[idem.OutcomeInProgress] != callers-1 {
		t.Fatalf("outcomes %v; want 1 executed, %d in progress", outcomes, callers-1)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("the operation's function ran %d times; want 2, the failed call's and one takeover's", n)
	}
	for range callers - 1 {
		resp, outcome, err := op.Run(ctx, key, req)
		if err != nil || outcome != idem.OutcomeReplayed {
			t.Fatalf("a caller's retry: %v, %v; want a replay", outcome, err)
		}
		answers = append(answers, resp)
	}
	r.settledOnce(key, amount, 2, 2, answers...)
}

// While an owner works within its lease, a duplicate gets ErrInProgress
// from the first look (operation_peek.sql) alone, opening no transaction, and
// operation_take.sql refuses to take a running lease even from a caller whose look
// came before the owner renewed it.
func TestOperationDuplicateWhileOwnerWorks(t *testing.T) {
	t.Parallel()
	r := newOpRig(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key, amount = "k-working", 800
	req := chargeReq{Amount: amount}
	at, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.proc.before = func(hctx context.Context, _ string) error {
		once.Do(func() { close(at) })
		select {
		case <-release:
			return nil
		case <-hctx.Done():
			return hctx.Err()
		}
	}
	owner := r.op(r.pool, nil, noHooks)
	done := make(chan runResult, 1)
	go func() { done <- runOp(ctx, owner, key, req) }()
	select {
	case <-at:
	case res := <-done:
		t.Fatalf("the owner ended (%v, %v) before the processor", res.outcome, res.err)
	}
	token, attempts := r.token(key)

	var begins atomic.Int32
	isBegin := faultproxy.ClientSQL("begin")
	r.proxy.SetRule(func(m faultproxy.Message) faultproxy.Action {
		if isBegin(m) {
			begins.Add(1)
		}
		return faultproxy.Pass
	})
	dup := r.op(r.ownerPool(), nil, noHooks)
	for range 3 {
		if _, outcome, err := dup.Run(ctx, key, req); outcome != idem.OutcomeInProgress || !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("a duplicate while the owner works: %v, %v; want ErrInProgress", outcome, err)
		}
		if outcome, err := dup.Resume(ctx, "", key); outcome != idem.OutcomeInProgress || !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("the completer while the owner works: %v, %v; want ErrInProgress", outcome, err)
		}
	}
	if n := begins.Load(); n != 0 {
		t.Fatalf("the duplicates opened %d transactions; the look alone must answer them", n)
	}

	take := readSQL(t, "../idem/sql/operation_take.sql")
	for {
		free, taken, err := tryTake(ctx, r, take, key)
		if pgCode(err) == pgerrcode.LockNotAvailable {
			continue // a renewal held the row for a moment
		}
		if err != nil {
			t.Fatal(err)
		}
		if free || taken {
			t.Fatalf("operation_take.sql on a running lease: free %v, taken %v; want neither", free, taken)
		}
		break
	}
	if tok, att := r.token(key); tok != token || att != attempts {
		t.Fatalf("token %d, attempts %d; the owner's are %d, %d", tok, att, token, attempts)
	}

	close(release)
	res := <-done
	if res.err != nil || res.outcome != idem.OutcomeExecuted {
		t.Fatalf("the owner: %v, %v", res.outcome, res.err)
	}
	r.settledOnce(key, amount, 1, 1, res.resp)
}

// tryTake runs operation_take.sql for key in a transaction it rolls back, and
// reports whether the lease was free and whether the statement took the
// operation (a new token).
func tryTake(ctx context.Context, r *opRig, take, key string) (free, taken bool, err error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return false, false, err
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, take, "", key, r.lease.Microseconds())
	if err != nil {
		return false, false, err
	}
	// Its first two columns: free, and the new token.
	row, err := pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) ([]any, error) { return row.Values() })
	if err != nil {
		return false, false, err
	}
	isFree, _ := row[0].(bool)
	return isFree, row[1] != nil, nil
}

// A caller whose look (operation_lock.sql) came just before an operation began
// sees its key free, and sends operation_begin.sql: the statement must find the
// key taken (no row, and the caller looks again) and leave the live
// operation alone. Its steps deleted, a database step would run twice.
func TestOperationBeginLeavesALiveOperationAlone(t *testing.T) {
	t.Parallel()
	r := newOpRig(t, sweepLease)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key, amount = "k-begun", 900
	req := chargeReq{Amount: amount}
	var down atomic.Bool
	r.proc.before = func(context.Context, string) error {
		if down.CompareAndSwap(false, true) {
			return errors.New("the processor is down")
		}
		return nil
	}
	op := r.op(r.pool, nil, noHooks)
	if _, outcome, err := op.Run(ctx, key, req); outcome != idem.OutcomeFailed || err == nil {
		t.Fatalf("the first call: %v, %v; want failed after its first step", outcome, err)
	}
	steps := r.steps(key)
	if len(steps) != 1 {
		t.Fatalf("steps %v; want the reservation recorded", steps)
	}

	tx, err := r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var token int64
	err = tx.QueryRow(ctx, readSQL(t, "../idem/sql/operation_begin.sql"), "", key, "another-hash",
		(24 * time.Hour).Microseconds(), "charge", []byte(`{"amount":1}`), r.lease.Microseconds(), nil, "00000000-0000-4000-8000-000000000000").Scan(&token)
	if !errors.Is(err, pgx.ErrNoRows) {
		_ = tx.Rollback(ctx)
		t.Fatalf("operation_begin.sql on a live operation's key: token %d, %v; want no row", token, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if now := r.steps(key); !slices.Equal(now, steps) {
		t.Fatalf("operation_begin.sql on a live operation's key changed its steps from %v to %v", steps, now)
	}

	resp, outcome, err := op.Run(ctx, key, req)
	if err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("the retry: %v, %v", outcome, err)
	}
	r.settledOnce(key, amount, 2, 2, resp)
}

// An unfinished operation outlives its key's TTL: Sweep leaves it however
// old it is, and the completer still finishes it.
func TestOperationUnfinishedOutlivesItsTTL(t *testing.T) {
	t.Parallel()
	r := newOpRig(t, sweepLease)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key, amount = "k-old", 1000
	req := chargeReq{Amount: amount}
	var down atomic.Bool
	r.proc.before = func(context.Context, string) error {
		if down.CompareAndSwap(false, true) {
			return errors.New("the processor is down")
		}
		return nil
	}
	op := r.op(r.pool, nil, noHooks)
	if _, outcome, err := op.Run(ctx, key, req); outcome != idem.OutcomeFailed || err == nil {
		t.Fatalf("the first call: %v, %v; want failed", outcome, err)
	}
	// Begun two days ago, with its TTL of a day long past.
	if _, err := r.pool.Exec(ctx, `UPDATE idempotency_keys
		SET created_at = created_at - interval '2 days', expires_at = expires_at - interval '2 days'
		WHERE idempotency_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	if n, err := r.client.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("Sweep: %d removed, %v; want the unfinished operation left", n, err)
	}
	if rec, err := r.client.Lookup(ctx, "", key); err != nil || rec.Status != idem.StatusUnfinished {
		t.Fatalf("Lookup after Sweep: %+v, %v; want unfinished", rec, err)
	}
	if outcome, err := op.Resume(ctx, "", key); err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("Resume: %v, %v", outcome, err)
	}
	r.settledOnce(key, amount, 2, 2)
}

// runResult is how one Run ended.
type runResult struct {
	resp    chargeResp
	outcome idem.Outcome
	err     error
}

func runOp(ctx context.Context, op *idem.Operation[chargeReq, chargeResp], key string, req chargeReq) runResult {
	resp, outcome, err := op.Run(ctx, key, req)
	return runResult{resp, outcome, err}
}

// runPast runs op for key in a goroutine, again while it answers
// ErrInProgress, and sends how the first other answer ended. A stopped
// owner's lease may have been renewed by a statement it sent just before
// SIGSTOP took hold and the server applied after the test saw the lease
// end: the next caller is then answered "in progress" for one more lease,
// which says nothing about the guarantee and depends on the machine's
// speed.
func runPast(ctx context.Context, op *idem.Operation[chargeReq, chargeResp], key string, req chargeReq) <-chan runResult {
	done := make(chan runResult, 1)
	go func() {
		for {
			res := runOp(ctx, op, key, req)
			if res.outcome != idem.OutcomeInProgress || ctx.Err() != nil {
				done <- res
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return done
}

// heldAt returns an operation on the test's own pool that stops at point
// until release is closed; reached is closed when it gets there.
func (r *opRig) heldAt(point opPoint) (op *idem.Operation[chargeReq, chargeResp], reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	op = r.op(r.pool, nil, func(ctx context.Context, p opPoint, _ pgx.Tx) error {
		if p != point {
			return nil
		}
		once.Do(func() { close(reached) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	return op, reached, release
}

// leaseEnded waits until the lease of key's operation has run out.
func (r *opRig) leaseEnded(ctx context.Context, key string) {
	r.t.Helper()
	for {
		var ended bool
		if err := r.pool.QueryRow(ctx, "SELECT lease_until <= now() FROM idempotency_keys_operations WHERE idempotency_key = $1", key).Scan(&ended); err != nil {
			r.t.Fatal(fmt.Errorf("the lease of %s: %w", key, err))
		}
		if ended {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
