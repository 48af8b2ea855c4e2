package integration_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// An operation runs each step once, stores its answer under the key, and
// replays it, to itself and to Do, exactly as Do's.
func TestOperationRunsOnceAndReplays(t *testing.T) {
	s := newOpSetup(t, nil)
	op := s.operation(nil, nil)
	ctx := context.Background()

	first, outcome, err := op.Run(ctx, "k1", chargeReq{Amount: 500})
	if err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("first Run: %v, %v", outcome, err)
	}
	again, outcome, err := op.Run(ctx, "k1", chargeReq{Amount: 500})
	if err != nil || outcome != idem.OutcomeReplayed || again != first {
		t.Fatalf("replay: %+v, %v, %v; want %+v replayed", again, outcome, err, first)
	}
	if res, rec := s.rowsOf("k1"); res != 1 || rec != 1 || s.proc.charged() != 1 || s.proc.callCount() != 1 {
		t.Fatalf("reservations %d, receipts %d, charges %d, calls %d; want 1 each", res, rec, s.proc.charged(), s.proc.callCount())
	}
	if n := s.unfinished(); n != 0 {
		t.Fatalf("%d unfinished rows after the operation finished", n)
	}
	if _, _, err := op.Run(ctx, "k1", chargeReq{Amount: 501}); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("another request under the key: %v, want ErrMismatch", err)
	}

	// Do on a finished operation's key: a replay if Do's hash is the
	// operation's (Lookup shows it), else a mismatch.
	rec, err := s.client.Lookup(ctx, "", "k1")
	if err != nil || rec.Status != idem.StatusCompleted {
		t.Fatalf("Lookup: %+v, %v", rec, err)
	}
	got, outcome, err := idem.Run(ctx, s.client, "k1", rec.RequestHash, func(context.Context, pgx.Tx) (chargeResp, error) {
		t.Fatal("Do ran its function on a finished operation's key")
		return chargeResp{}, nil
	})
	if err != nil || outcome != idem.OutcomeReplayed || got != first {
		t.Fatalf("Do on the key: %+v, %v, %v", got, outcome, err)
	}
}

// A step that failed leaves the operation unfinished, holding its key
// against Do; the retry continues after the steps recorded, which do not
// run again, and the processor charges once.
func TestOperationResumesFromItsRecoveryPoint(t *testing.T) {
	s := newOpSetup(t, nil)
	ctx := context.Background()
	op, answer := s.losingCharge()

	_, outcome, err := op.Run(ctx, "k", chargeReq{Amount: 700})
	if outcome != idem.OutcomeFailed || err == nil {
		t.Fatalf("first Run: %v, %v; want failed", outcome, err)
	}
	rec, err := s.client.Lookup(ctx, "", "k")
	if err != nil || rec.Status != idem.StatusUnfinished {
		t.Fatalf("Lookup of the unfinished operation: %+v, %v", rec, err)
	}
	if _, outcome, err := idem.Run(ctx, s.client, "k", rec.RequestHash, func(context.Context, pgx.Tx) (int, error) {
		t.Fatal("Do ran on an unfinished operation's key")
		return 0, nil
	}); !errors.Is(err, idem.ErrInProgress) || outcome != idem.OutcomeInProgress {
		t.Fatalf("Do on an unfinished operation's key: %v, %v; want ErrInProgress", outcome, err)
	}
	if n, err := s.client.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("Sweep: %d, %v; want nothing removed", n, err)
	}
	st, err := s.client.Stats(ctx)
	if err != nil || st.Unfinished != 1 || st.OldestUnfinished <= 0 {
		t.Fatalf("Stats: %+v, %v; want 1 unfinished", st, err)
	}

	answer()
	resp, outcome, err := op.Run(ctx, "k", chargeReq{Amount: 700})
	if err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("retry: %v, %v", outcome, err)
	}
	if res, receipts := s.rowsOf("k"); res != 1 || receipts != 1 {
		t.Fatalf("reservations %d, receipts %d; want 1 each", res, receipts)
	}
	if s.proc.charged() != 1 || s.proc.callCount() != 2 {
		t.Fatalf("charges %d, calls %d; want 1 charge from 2 calls with one key", s.proc.charged(), s.proc.callCount())
	}
	if resp.ChargeID != "ch_1" {
		t.Fatalf("answer %+v", resp)
	}
	if n := s.unfinished(); n != 0 {
		t.Fatalf("%d unfinished rows", n)
	}
}

// A refusal from the operation's function is stored and replayed; the
// steps before it keep their effects, as the function decided.
func TestOperationStoresARefusal(t *testing.T) {
	s := newOpSetup(t, nil)
	op := s.operation(nil, nil)
	ctx := context.Background()
	_, outcome, err := op.Run(ctx, "big", chargeReq{Amount: 2_000_000})
	var r *idem.Refusal
	if outcome != idem.OutcomeRefused || !errors.As(err, &r) || r.Code != "amount_too_large" {
		t.Fatalf("Run: %v, %v; want the refusal", outcome, err)
	}
	_, outcome, err = op.Run(ctx, "big", chargeReq{Amount: 2_000_000})
	if outcome != idem.OutcomeReplayed || !errors.As(err, &r) {
		t.Fatalf("replay: %v, %v", outcome, err)
	}
	if s.proc.callCount() != 0 {
		t.Fatal("the processor was called for a refused amount")
	}
}

// 32 concurrent callers of one key make one processor call: one owns the
// operation, the others get ErrInProgress at once.
func TestOperationStorm(t *testing.T) {
	s := newOpSetup(t, nil)
	release := make(chan struct{})
	s.proc.before = func(context.Context, string) error { <-release; return nil }
	op := s.operation(nil, nil)
	ctx := context.Background()
	const callers = 32
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[idem.Outcome]int{}
	)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, outcome, _ := op.Run(ctx, "hot", chargeReq{Amount: 100})
			mu.Lock()
			outcomes[outcome]++
			mu.Unlock()
		}()
	}
	// The others answer while the owner waits at the processor.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := outcomes[idem.OutcomeInProgress]
		mu.Unlock()
		if n == callers-1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	if outcomes[idem.OutcomeExecuted] != 1 || outcomes[idem.OutcomeInProgress] != callers-1 {
		t.Fatalf("outcomes %v; want 1 executed, %d in progress", outcomes, callers-1)
	}
	if s.proc.callCount() != 1 {
		t.Fatalf("%d processor calls from %d callers; want 1", s.proc.callCount(), callers)
	}
}

// Resume finishes an operation from its stored request, as the completer
// does when the client never returns.
func TestOperationResume(t *testing.T) {
	s := newOpSetup(t, nil)
	ctx := context.Background()
	cctx, cancel := context.WithCancel(ctx)
	op := s.operation(map[string]func(context.Context) error{
		"reserve": func(context.Context) error { cancel(); return nil },
	}, &idem.OperationConfig[chargeReq, chargeResp]{Lease: 200 * time.Millisecond})
	if _, outcome, err := op.Run(cctx, "gone", chargeReq{Amount: 42}); outcome != idem.OutcomeFailed || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run whose client gave up: %v, %v", outcome, err)
	}
	if outcome, err := op.Resume(ctx, "", "gone"); err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("Resume: %v, %v", outcome, err)
	}
	if outcome, err := op.Resume(ctx, "", "gone"); err != nil || outcome != idem.OutcomeReplayed {
		t.Fatalf("Resume again: %v, %v", outcome, err)
	}
	if _, err := op.Resume(ctx, "", "never"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Resume of a key never used: %v", err)
	}
	if res, rec := s.rowsOf("gone"); res != 1 || rec != 1 || s.proc.charged() != 1 {
		t.Fatalf("reservations %d, receipts %d, charges %d", res, rec, s.proc.charged())
	}
}

// A key left unfinished without its operation's row (a hand edit) is
// reported as corrupt, by Run and by Resume alike, and no step runs: the
// steps would run again without their records.
func TestOperationWithoutItsStateIsCorrupt(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx := context.Background()
	op, answer := s.stoppedAtCharge("k", 700)
	answer()
	s.exec("DELETE FROM idempotency_keys_operations")
	for name, call := range map[string]func() (idem.Outcome, error){
		"Run": func() (idem.Outcome, error) {
			_, outcome, err := op.Run(ctx, "k", chargeReq{Amount: 700})
			return outcome, err
		},
		"Resume": func() (idem.Outcome, error) { return op.Resume(ctx, "", "k") },
	} {
		if outcome, err := call(); !errors.Is(err, idem.ErrCorruptRecord) || outcome != idem.OutcomeFailed {
			t.Fatalf("%s: %v, %v; want ErrCorruptRecord", name, outcome, err)
		}
	}
	if res, receipts := s.rowsOf("k"); res != 1 || receipts != 0 {
		t.Fatalf("reservations %d, receipts %d; want the first Run's reservation only", res, receipts)
	}
	if calls := s.proc.callCount(); calls != 1 {
		t.Fatalf("%d processor calls; want the first Run's one", calls)
	}
}
