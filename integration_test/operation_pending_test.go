package integration_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// What the owner leaves uncommitted between its steps: a database step's
// transaction stays open until what comes next commits it, and an external
// step's output is held in memory until the owner's next commit. These
// tests kill or stop a real owner process in those windows.

// An owner killed after its external call returned, before anything
// committed the call's output (the receipt step had not begun), leaves the
// step begun and unrecorded. Without a deadline, the next owner calls the
// processor again with the same derived key, and the processor charges
// once; past the deadline, Compensate is told the step with that key and
// undoes it.
func TestOperationOwnerKilledWithAnOutputHeld(t *testing.T) {
	t.Parallel()
	db := newOpSetup(t, nil)
	for n, settle := range []string{"takeover", "compensate"} {
		app, key := "idem-held-"+settle, "k-held-"+settle
		t.Run(settle, func(t *testing.T) {
			t.Parallel()
			r := rigOn(t, db.pool, db.client, app, sweepLease)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			amount := int64(700 + n)
			req := chargeReq{Amount: amount}
			cfg := ownerConfig{URL: r.proxied, App: r.app, Processor: serveProcessor(t, r.proc),
				Key: key, Amount: amount, Lease: r.lease, Stop: string(receiptBefore)}
			if settle == "compensate" {
				cfg.Deadline = time.Millisecond
			}
			a := startOwner(t, cfg)
			a.reach(receiptBefore)
			a.kill()
			a.killed()
			if keys := r.proc.seen(); len(keys) != 1 || r.proc.charged() != 1 {
				t.Fatalf("before the next owner: processor keys %v, %d charges; want one call that charged", keys, r.proc.charged())
			}
			if st := r.steps(key); len(st) != 1 || !strings.HasPrefix(st[0], "reserve@") {
				t.Fatalf("recorded steps %v; want the reserve alone: the charge's output died with its owner", st)
			}
			first := r.proc.seen()[0]

			if settle == "takeover" {
				answer, trail := r.settleBy(ctx, byRetry, r.op(r.pool, nil, noHooks), key, req)
				t.Logf("the next caller: %v", trail)
				if keys := r.proc.seen(); !slices.Equal(keys, []string{first, first}) {
					t.Fatalf("processor keys %v; want the dead owner's key, then the same key again", keys)
				}
				r.settledOnce(key, amount, 2, 2, answer)
				return
			}

			b, compensated := r.voidingCompleter()
			outcome, err := b.Resume(ctx, "", key)
			for (outcome == idem.OutcomeInProgress || idem.Retryable(err)) && ctx.Err() == nil {
				time.Sleep(r.lease / 3)
				outcome, err = b.Resume(ctx, "", key)
			}
			if outcome != idem.OutcomeRefused || err != nil {
				t.Fatalf("the completer: %v, %v; want the compensation's refusal stored", outcome, err)
			}
			if told := compensated(); len(told) != 1 || !slices.Equal(told[0], []idem.ExternalCall{{Step: "charge", Key: first}}) {
				t.Fatalf("Compensate was told %v; want the charge under %s", told, first)
			}
			if n := r.proc.charged(); n != 0 || r.proc.callCount() != 1 {
				t.Fatalf("%d charges from %d calls after the compensation; want the one call voided", n, r.proc.callCount())
			}
			if res, rec := r.rowsOf(key); res != 1 || rec != 0 || r.unfinished(key) != 0 {
				t.Fatalf("%d reservations, %d receipts, %d unfinished rows; want the reserve, no receipt, finished", res, rec, r.unfinished(key))
			}
		})
	}
}

// An owner stopped (SIGSTOP) while a database step of its is pending holds
// the operation no longer than its lease, although its Config.IdleTimeout
// is ten minutes: the pending transaction's idle timeout is the lease, so
// the server ends it and the step rolls back with its record. The next
// caller takes the operation over and runs the step again; the owner,
// resumed, commits nothing and stops with ErrLeaseLost, and the step's
// write exists once.
func TestOperationPausedOwnerLosesItsPendingStep(t *testing.T) {
	t.Parallel()
	r := newOpRig(t, sweepLease)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key, amount = "k-pending", 800
	req := chargeReq{Amount: amount}

	a := r.owner(key, amount, reserveAfter, 10*time.Minute)
	a.reach(reserveAfter)
	a.signal(syscall.SIGSTOP)
	staleToken, _ := r.token(key)
	// The pending transaction ends while the owner is still stopped: long
	// before Config.IdleTimeout could end it.
	for r.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND application_name = $1 AND state LIKE 'idle in transaction%'`, r.app) != 0 {
		if ctx.Err() != nil {
			t.Fatal("the stopped owner's pending step outlived its lease")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := r.steps(key); len(st) != 0 {
		t.Fatalf("recorded steps %v once the pending step's session ended; want none", st)
	}

	b, reached, release := r.heldAt(receiptAfter)
	done := runPast(ctx, b, key, req)
	select {
	case <-reached:
	case res := <-done:
		t.Fatalf("the next caller ended (%v, %v) instead of taking the operation over", res.outcome, res.err)
	}
	if token, _ := r.token(key); token == staleToken {
		t.Fatal("the next caller runs under the stopped owner's token")
	}

	a.signal(syscall.SIGCONT)
	a.proceed()
	stale := a.result()
	if stale.Outcome != idem.OutcomeFailed.String() || !stale.LeaseLost {
		t.Fatalf("the resumed owner: %+v; want failed with ErrLeaseLost", stale)
	}
	for _, s := range r.steps(key) {
		if strings.HasSuffix(s, "@"+strconv.FormatInt(staleToken, 10)) {
			t.Fatalf("steps %v: the resumed owner's pending step committed", r.steps(key))
		}
	}
	if calls := r.proc.callCount(); calls != 1 {
		t.Fatalf("%d processor calls; want the next caller's alone", calls)
	}

	close(release)
	res := <-done
	if res.err != nil || res.outcome != idem.OutcomeExecuted {
		t.Fatalf("the caller that took over: %v, %v", res.outcome, res.err)
	}
	r.settledOnce(key, amount, 1, 1, res.resp)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the test ran out of time")
	}
}

// A live owner that does not go on for several leases after a database
// step keeps both the step and the operation: its pending step is
// committed a third of the lease after it returned (as a renewal would
// fall due), the renewals go on, and a caller polling the whole time is
// answered "in progress".
func TestOperationLiveOwnerKeepsItsPendingStep(t *testing.T) {
	t.Parallel()
	// Two seconds, not sweepLease: the owner renews every third of a lease,
	// and a loaded machine must not stall it past one.
	r := newOpRig(t, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key, amount = "k-live-pending", 900
	req := chargeReq{Amount: amount}
	a, reached, release := r.heldAt(reserveAfter)
	done := runPast(ctx, a, key, req)
	<-reached
	token, _ := r.token(key)
	for !slices.Equal(r.steps(key), []string{"reserve@" + strconv.FormatInt(token, 10)}) {
		if ctx.Err() != nil {
			t.Fatalf("steps %v: the live owner's pending step never committed", r.steps(key))
		}
		time.Sleep(20 * time.Millisecond)
	}
	other := r.op(r.pool, nil, noHooks)
	for range 3 {
		if _, outcome, err := other.Run(ctx, key, req); outcome != idem.OutcomeInProgress {
			t.Fatalf("a call while the owner lives: %v, %v; want in progress", outcome, err)
		}
		time.Sleep(r.lease / 2)
	}
	if tok, attempts := r.token(key); tok != token || attempts != 1 {
		t.Fatalf("token %d, attempts %d; want the live owner's %d, 1", tok, attempts, token)
	}
	close(release)
	res := <-done
	if res.err != nil || res.outcome != idem.OutcomeExecuted {
		t.Fatalf("the live owner: %v, %v", res.outcome, res.err)
	}
	r.settledOnce(key, amount, 1, 1, res.resp)
}

// txCounter is a pgx tracer that counts the transactions a connection
// commits: each COMMIT, and each statement sent outside a transaction (an
// implicit transaction of its own, read-only ones included), as
// PostgreSQL's xact_commit counts them.
type txCounter struct{ n atomic.Int64 }

type txStatusKey struct{}

func (c *txCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, txStatusKey{}, conn.PgConn().TxStatus())
}

func (c *txCounter) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	switch {
	case d.Err != nil:
	case d.CommandTag.String() == "COMMIT":
		c.n.Add(1)
	case ctx.Value(txStatusKey{}) == byte('I') && conn.PgConn().TxStatus() == 'I':
		c.n.Add(1)
	}
}

func (c *txCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *txCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if d.Err == nil && d.CommandTag.String() == "COMMIT" {
		c.n.Add(1)
	}
}

func (c *txCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A charge (reserve step, processor call, receipt step) commits four
// transactions: the read-only look that starts every call, the beginning,
// the reserve with the call's fence, the receipt with the answer. An
// operation of one step commits three: the look, the beginning, the step
// with the answer.
func TestOperationCommitsPerCharge(t *testing.T) {
	t.Parallel()
	db := newOpSetup(t, nil)
	cfg := db.pool.Config().Copy()
	counter := &txCounter{}
	cfg.ConnConfig.Tracer = counter
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	client, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	charge, err := idem.NewOperation(client, "charge", boundarySteps(db.proc.Charge, noHooks), nil)
	if err != nil {
		t.Fatal(err)
	}
	oneStep, err := idem.NewOperation(client, "reserve", func(s *idem.Steps, req chargeReq) (int64, error) {
		key := s.Key().Key
		return idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			_, err := tx.Exec(ctx, "INSERT INTO op_reservations VALUES ($1, $2)", key, req.Amount)
			return req.Amount, err
		})
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The first call of each also checks the table's layout, once.
	if _, outcome, err := charge.Run(ctx, "k-count-warm", chargeReq{Amount: 1}); outcome != idem.OutcomeExecuted {
		t.Fatalf("charge: %v, %v", outcome, err)
	}
	if _, outcome, err := oneStep.Run(ctx, "k-count-warm1", chargeReq{Amount: 1}); outcome != idem.OutcomeExecuted {
		t.Fatalf("one step: %v, %v", outcome, err)
	}
	const n = 10
	for _, c := range []struct {
		name string
		run  func(key string) (idem.Outcome, error)
		want int64
	}{
		{"charge", func(key string) (idem.Outcome, error) {
			_, outcome, err := charge.Run(ctx, key, chargeReq{Amount: 5})
			return outcome, err
		}, 4},
		{"one step", func(key string) (idem.Outcome, error) {
			_, outcome, err := oneStep.Run(ctx, key, chargeReq{Amount: 5})
			return outcome, err
		}, 3},
	} {
		before := counter.n.Load()
		for i := range n {
			if outcome, err := c.run("k-count-" + c.name + strconv.Itoa(i)); outcome != idem.OutcomeExecuted {
				t.Fatalf("%s: %v, %v", c.name, outcome, err)
			}
		}
		if got := counter.n.Load() - before; got != c.want*n {
			t.Errorf("%s: %d transactions committed in %d calls; want %d each", c.name, got, n, c.want)
		}
	}
}
