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

// lastCall is an Observer that keeps the last CallEnd.
type lastCall struct {
	mu  sync.Mutex
	end idem.CallEnd
}

func (o *lastCall) CallStart(ctx context.Context, _ idem.CallStart) context.Context { return ctx }
func (o *lastCall) CallEnd(_ context.Context, e idem.CallEnd) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.end = e
}

func (o *lastCall) last() idem.CallEnd {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.end
}

// WithWait(d) waits for the key's holder at most d: when d passes with the
// key still held, the call returns ErrInProgress. The holder here does not
// finish until the waiting call has returned, so a wait that ignored its
// bound would run into the test's deadline instead.
func TestWaitEndsAtItsBound(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	// Two seconds: the bound counts from the call's start, and a loaded
	// machine must not spend it all on the first look.
	const bound = 2 * time.Second
	release, releaseHolder := holderRelease(t)
	holderDone := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), s.pool, "k-held", "h", func(pgx.Tx) (int, error) {
			<-release
			return 1, nil
		})
		holderDone <- err
	}()
	waitForLock(t, s)

	// The deadline is a bound for a broken wait, far above the 2 s asked.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	obs := &lastCall{}
	ran := false
	start := time.Now()
	_, outcome, err := idem.Run(ctx, s.pool, "k-held", "h", func(context.Context, pgx.Tx) (int, error) { ran = true; return 2, nil },
		idem.WithWait(bound), idem.WithObserver(obs))
	waited := time.Since(start)
	releaseHolder()
	if err := <-holderDone; err != nil {
		t.Fatal(err)
	}
	switch {
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("WithWait(%v) against a holder that never finished ran until the test's deadline (%v, %v): the bound was ignored", bound, outcome, err)
	case !errors.Is(err, idem.ErrInProgress) || outcome != idem.OutcomeInProgress:
		t.Fatalf("after waiting %v: %v, %v; want ErrInProgress", waited, outcome, err)
	case ran:
		t.Fatal("fn ran while the key was held")
	case waited < bound:
		t.Fatalf("returned after %v, before its bound %v", waited, bound)
	case !obs.last().Waited:
		t.Fatal("the observer was not told that the call waited")
	}
	// Once the holder committed, the same wait replays its result.
	got, outcome, err := idem.Run(ctx, s.pool, "k-held", "h", func(context.Context, pgx.Tx) (int, error) { return 2, nil }, idem.WithWait(bound))
	if err != nil || outcome != idem.OutcomeReplayed || got != 1 {
		t.Fatalf("after the holder committed: %d, %v, %v; want 1 replayed", got, outcome, err)
	}
}
