package idemriver_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemriver"
)

// The operations below have short leases, and their jobs run a little
// after them, so that the tests wait for River's scheduler rather than
// for a lease. A lease is still two seconds: a live owner renews every
// third of one, and a loaded machine must not stall it past a lease.
const (
	lease = 2 * time.Second
	after = 2200 * time.Millisecond
)

// An operation whose client gave up, at any point of its steps, is
// finished by the completer alone: each step's rows exist once, the
// processor charged once, the answer is stored and replays, the job
// recorded that it executed the operation, and nothing is left
// unfinished.
func TestCompleterFinishesWhatTheClientGaveUp(t *testing.T) {
	type giveUp struct {
		inReserve, between func(ctx context.Context) error
		procAfter          func(ctx context.Context) error
	}
	cases := []struct {
		name string
		// points returns where the client gives up: cancel ends its
		// context, once.
		points func(cancel func()) giveUp
		// clientCalls is how many processor calls the client's run made.
		clientCalls int
	}{
		{"during the first step", func(cancel func()) giveUp {
			return giveUp{inReserve: once(cancel)}
		}, 0},
		{"between the steps", func(cancel func()) giveUp {
			return giveUp{between: once(cancel)}
		}, 0},
		{"after the processor acted", func(cancel func()) giveUp {
			return giveUp{procAfter: once(cancel)}
		}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			g := tc.points(cancel)
			f.proc.after = g.procAfter
			op, err := idem.NewOperation(f.keys, "charge", f.steps(g.inReserve, g.between),
				&idem.OperationConfig[chargeReq, chargeResp]{Lease: lease, OnStart: idemriver.OnStart(f.river, after)})
			if err != nil {
				t.Fatal(err)
			}
			f.start(op)
			const key = "order-1"
			req := chargeReq{Amount: 2500}

			_, got, err := op.Run(ctx, key, req)
			if got != idem.OutcomeFailed || !errors.Is(err, context.Canceled) {
				t.Fatalf("the client's Run: %v, %v; want failed with context.Canceled", got, err)
			}
			if calls := f.proc.callCount(); calls != tc.clientCalls {
				t.Fatalf("the client's run called the processor %d times, want %d", calls, tc.clientCalls)
			}

			job := f.job(key)
			if job.State != rivertype.JobStateCompleted || outcome(t, job) != "executed" {
				t.Fatalf("completer job: %s, output %s, errors %v; want completed, executed", job.State, job.Output(), job.Errors)
			}
			charges, id := f.proc.charged()
			if res, rec, ref := f.rows(key); res != 1 || rec != 1 || ref != 0 || charges != 1 {
				t.Fatalf("reservations %d, receipts %d, refunds %d, charges %d; want 1, 1, 0, 1", res, rec, ref, charges)
			}
			want := chargeResp{ChargeID: id, Amount: req.Amount}
			stored, err := f.keys.Lookup(t.Context(), "", key)
			if err != nil || stored.Status != idem.StatusCompleted {
				t.Fatalf("Lookup: %+v, %v; want completed", stored, err)
			}
			if v, err := idem.DecodeResult[chargeResp](stored); err != nil || v != want {
				t.Fatalf("stored answer %+v, %v; want %+v", v, err, want)
			}
			if n := f.unfinished(); n != 0 {
				t.Fatalf("Stats.Unfinished %d after the completer, want 0", n)
			}
			// The client's retry, had it come, gets the completer's answer.
			v, got, err := op.Run(t.Context(), key, req)
			if got != idem.OutcomeReplayed || err != nil || v != want {
				t.Fatalf("retry: %+v, %v, %v; want %+v replayed", v, got, err, want)
			}
		})
	}
}

// A job that finds the operation's owner at work snoozes, changing
// nothing; once the owner gives up, a later run finishes the operation.
func TestCompleterSnoozesWhileTheLeaseIsHeld(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	snoozed, stop := f.river.Subscribe(river.EventKindJobSnoozed)
	defer stop()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The owner's processor call hangs until the owner gives up; the
	// completer's goes through.
	var first atomic.Bool
	f.proc.before = func(ctx context.Context) error {
		if first.CompareAndSwap(false, true) {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	op, err := idem.NewOperation(f.keys, "charge", f.steps(nil, nil),
		&idem.OperationConfig[chargeReq, chargeResp]{Lease: lease, OnStart: idemriver.OnStart(f.river, after)})
	if err != nil {
		t.Fatal(err)
	}
	f.start(op)
	const key = "order-2"
	req := chargeReq{Amount: 1200}

	ran := make(chan error, 1)
	go func() {
		_, _, err := op.Run(ctx, key, req)
		ran <- err
	}()
	select {
	case ev := <-snoozed:
		if ev.Job.Kind != (idemriver.CompleteArgs{}).Kind() {
			t.Fatalf("a %s job snoozed", ev.Job.Kind)
		}
	case err := <-ran:
		t.Fatalf("the owner's Run returned before the job snoozed: %v", err)
	case <-time.After(liveness):
		t.Fatalf("no snooze within %v", liveness)
	}
	if res, rec, _ := f.rows(key); res != 1 || rec != 0 {
		t.Fatalf("while the owner holds the lease: reservations %d, receipts %d; want 1, 0", res, rec)
	}
	cancel()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Fatalf("the owner's Run: %v, want context.Canceled", err)
	}

	job := f.job(key)
	if job.State != rivertype.JobStateCompleted || outcome(t, job) != "executed" {
		t.Fatalf("completer job: %s, output %s, errors %v; want completed, executed", job.State, job.Output(), job.Errors)
	}
	charges, _ := f.proc.charged()
	if res, rec, _ := f.rows(key); res != 1 || rec != 1 || charges != 1 {
		t.Fatalf("reservations %d, receipts %d, charges %d; want 1 each", res, rec, charges)
	}
	if n := f.unfinished(); n != 0 {
		t.Fatalf("Stats.Unfinished %d after the completer, want 0", n)
	}
}

// An operation the completer reaches past its Deadline is compensated:
// its Compensate's refusal is stored as its answer, the processor is never
// called, and the reserve step is undone by the refund step.
func TestCompleterCompensatesPastTheDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	op, err := idem.NewOperation(f.keys, "charge", f.steps(nil, once(cancel)),
		&idem.OperationConfig[chargeReq, chargeResp]{
			Lease:      lease,
			Deadline:   after / 2,
			Compensate: refund,
			OnStart:    idemriver.OnStart(f.river, after),
		})
	if err != nil {
		t.Fatal(err)
	}
	f.start(op)
	const key = "order-3"
	req := chargeReq{Amount: 900}

	if _, got, err := op.Run(ctx, key, req); got != idem.OutcomeFailed || !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's Run: %v, %v; want failed with context.Canceled", got, err)
	}
	job := f.job(key)
	if job.State != rivertype.JobStateCompleted || outcome(t, job) != "refused" {
		t.Fatalf("completer job: %s, output %s, errors %v; want completed, refused", job.State, job.Output(), job.Errors)
	}
	stored, err := f.keys.Lookup(t.Context(), "", key)
	if err != nil || stored.Status != idem.StatusRefused || stored.Refusal == nil || stored.Refusal.Code != "expired" ||
		!strings.Contains(stored.Refusal.Message, idem.ErrDeadline.Error()) {
		t.Fatalf("Lookup: %+v (refusal %+v), %v; want the compensation's refusal", stored, stored.Refusal, err)
	}
	if res, rec, ref := f.rows(key); res != 1 || rec != 0 || ref != 1 || f.proc.callCount() != 0 {
		t.Fatalf("reservations %d, receipts %d, refunds %d, processor calls %d; want 1, 0, 1, 0", res, rec, ref, f.proc.callCount())
	}
	if n := f.unfinished(); n != 0 {
		t.Fatalf("Stats.Unfinished %d after the completer, want 0", n)
	}
	_, got, err := op.Run(t.Context(), key, req)
	if r, ok := errors.AsType[*idem.Refusal](err); got != idem.OutcomeReplayed || !ok || r.Code != "expired" {
		t.Fatalf("retry: %v, %v; want the refusal replayed", got, err)
	}
}

// Jobs the completer cannot resume end at once: a key that holds nothing
// completes as not found; an operation the Worker does not know is
// cancelled with an error that names it.
func TestCompleterEndsJobsItCannotResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	op, err := idem.NewOperation(f.keys, "charge", f.steps(nil, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	f.start(op)
	ctx := t.Context()
	if _, err := f.river.Insert(ctx, idemriver.CompleteArgs{Operation: "charge", Key: "never-begun"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.river.Insert(ctx, idemriver.CompleteArgs{Operation: "refund", Key: "someone-elses"}, nil); err != nil {
		t.Fatal(err)
	}
	if job := f.job("never-begun"); job.State != rivertype.JobStateCompleted || outcome(t, job) != idemriver.OutcomeNotFound {
		t.Fatalf("job of a key that holds nothing: %s, output %s; want completed, %s", job.State, job.Output(), idemriver.OutcomeNotFound)
	}
	job := f.job("someone-elses")
	if job.State != rivertype.JobStateCancelled || len(job.Errors) != 1 ||
		!strings.Contains(job.Errors[0].Error, idemriver.ErrUnknownOperation.Error()) || !strings.Contains(job.Errors[0].Error, `"refund"`) {
		t.Fatalf("job of an unknown operation: %s, errors %+v; want cancelled with ErrUnknownOperation naming it", job.State, job.Errors)
	}
}

// once returns a hook that calls cancel and fails with its context's
// error the first time, and does nothing after: the client gives up; the
// completer's run goes through.
func once(cancel func()) func(ctx context.Context) error {
	var fired atomic.Bool
	return func(ctx context.Context) error {
		if !fired.CompareAndSwap(false, true) {
			return nil
		}
		cancel()
		<-ctx.Done()
		return ctx.Err()
	}
}
