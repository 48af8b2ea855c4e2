package idem_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/testdb"
)

// recorder is an Observer that keeps every start and end it is told about.
type recorder struct {
	mu     sync.Mutex
	starts []idem.CallStart
	ends   []idem.CallEnd
}

type recorderKey struct{}

func (r *recorder) CallStart(ctx context.Context, c idem.CallStart) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, c)
	return context.WithValue(ctx, recorderKey{}, len(r.starts))
}

func (r *recorder) CallEnd(ctx context.Context, c idem.CallEnd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Value(recorderKey{}) == nil {
		panic("CallEnd did not receive CallStart's context")
	}
	r.ends = append(r.ends, c)
}

// last returns the only end recorded since the previous call of last, and
// fails unless exactly one start and one end were recorded meanwhile.
func (r *recorder) last(t *testing.T) idem.CallEnd {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.starts) != 1 || len(r.ends) != 1 {
		t.Fatalf("%d starts and %d ends, want one of each", len(r.starts), len(r.ends))
	}
	end := r.ends[0]
	r.starts, r.ends = nil, nil
	return end
}

// TestObserverReportsEveryCallOnce runs each kind of ending through Do, Run
// and Wrap and checks that the observer hears of each exactly once, with the
// outcome, the refusal flag and the error.
func TestObserverReportsEveryCallOnce(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t)
	rec := &recorder{}
	keys, err := idem.NewClient(pool, &idem.Config{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(pgx.Tx) (int, error) { return 1, nil }
	refuse := func(pgx.Tx) (int, error) { return 0, idem.Refuse("declined", "declined") }
	boom := errors.New("boom")
	anyErr := errors.New("any error")

	check := func(name string, want idem.Outcome, refused bool, wantErr error) {
		t.Helper()
		end := rec.last(t)
		if end.Outcome != want || end.Refused != refused || end.Table != idem.DefaultTable {
			t.Fatalf("%s: outcome %v refused %v table %q; want %v %v %q", name, end.Outcome, end.Refused, end.Table, want, refused, idem.DefaultTable)
		}
		if (wantErr == nil) != (end.Err == nil) || (wantErr != nil && !errors.Is(wantErr, anyErr) && !errors.Is(end.Err, wantErr)) {
			t.Fatalf("%s: err %v, want %v", name, end.Err, wantErr)
		}
		if end.Duration <= 0 || end.HTTPStatus != 0 {
			t.Fatalf("%s: duration %v, HTTP status %d", name, end.Duration, end.HTTPStatus)
		}
	}

	_, _ = idem.Do(ctx, keys, "k1", "h", ok)
	check("first", idem.OutcomeExecuted, false, nil)
	_, _ = idem.Do(ctx, keys, "k1", "h", ok)
	check("replay", idem.OutcomeReplayed, false, nil)
	_, _ = idem.Do(ctx, keys, "k1", "other", ok)
	check("mismatch", idem.OutcomeMismatch, false, idem.ErrMismatch)
	_, _ = idem.Do(ctx, keys, "k2", "h", refuse)
	check("refusal", idem.OutcomeRefused, true, &idem.Refusal{Code: "declined"})
	_, _ = idem.Do(ctx, keys, "k2", "h", refuse)
	check("replayed refusal", idem.OutcomeReplayed, true, &idem.Refusal{Code: "declined"})
	_, _ = idem.Do(ctx, keys, "k3", "h", func(pgx.Tx) (int, error) { return 0, boom })
	check("fn error", idem.OutcomeFailed, false, boom)
	_, _ = idem.Do(ctx, keys, "", "h", ok)
	check("invalid key", idem.OutcomeInvalid, false, idem.ErrInvalidKey)
	_, _ = idem.Do[int](ctx, keys, "k4", "h", nil)
	check("Do without fn", idem.OutcomeInvalid, false, idem.ErrInvalidOption)
	_, _, _ = idem.Run[int](ctx, keys, "k4", "h", nil)
	check("Run without fn", idem.OutcomeInvalid, false, idem.ErrInvalidOption)
	// A Refusal without a Code is a programming error: nothing is stored,
	// so the call is not a refusal.
	_, _ = idem.Do(ctx, keys, "k5", "h", func(pgx.Tx) (int, error) { return 0, idem.Refuse("", "no code") })
	check("refusal without code", idem.OutcomeFailed, false, anyErr)

	charge := idem.Wrap(keys, "charge", func(context.Context, pgx.Tx, int) (int, error) { return 2, nil })
	// Wrap returns the outcome its observer is told.
	if _, outcome, _ := charge(ctx, "k6", 1); outcome != idem.OutcomeExecuted {
		t.Fatalf("Wrap returned outcome %v, want %v", outcome, idem.OutcomeExecuted)
	}
	check("Wrap", idem.OutcomeExecuted, false, nil)
	broken := idem.Wrap(keys, "", func(context.Context, pgx.Tx, int) (int, error) { return 2, nil })
	if _, outcome, _ := broken(ctx, "k6", 1); outcome != idem.OutcomeInvalid {
		t.Fatalf("Wrap without operation returned outcome %v, want %v", outcome, idem.OutcomeInvalid)
	}
	check("Wrap without operation", idem.OutcomeInvalid, false, idem.ErrInvalidOption)

	// In progress, then a waiter that outlasts nothing: Waited is set.
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := idem.Do(ctx, keys, "k7", "h", func(pgx.Tx) (int, error) {
			close(held)
			<-release
			return 1, nil
		}, idem.WithObserver(nil))
		done <- err
	}()
	<-held
	_, _ = idem.Do(ctx, keys, "k7", "h", ok)
	check("in progress", idem.OutcomeInProgress, false, idem.ErrInProgress)
	_, _ = idem.Do(ctx, keys, "k7", "h", ok, idem.WithWait(30*time.Millisecond))
	end := rec.last(t)
	if end.Outcome != idem.OutcomeInProgress || !end.Waited {
		t.Fatalf("waiting call: outcome %v waited %v, want in_progress and waited", end.Outcome, end.Waited)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestObserverHearsOfPanics checks that a call whose fn panics is reported,
// as failed, before the panic goes on.
func TestObserverHearsOfPanics(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t)
	rec := &recorder{}
	func() {
		defer func() {
			if p := recover(); p != "fn broke" {
				t.Fatalf("recovered %v, want the panic of fn", p)
			}
		}()
		_, _ = idem.Do(ctx, pool, "k", "h", func(pgx.Tx) (int, error) { panic("fn broke") }, idem.WithObserver(rec))
	}()
	end := rec.last(t)
	if end.Outcome != idem.OutcomeFailed || end.Err == nil || end.Refused {
		t.Fatalf("panicking call reported as %v (err %v, refused %v), want failed with an error", end.Outcome, end.Err, end.Refused)
	}
	// The panic rolled back: the key is free and runs again.
	if _, outcome, err := idem.Run(ctx, pool, "k", "h", func(context.Context, pgx.Tx) (int, error) { return 1, nil }, idem.WithObserver(rec)); err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("after the panic: %v, %v", outcome, err)
	}
	rec.last(t)
}

// noopObserver does nothing: it measures what the hook itself costs.
type noopObserver struct{}

func (noopObserver) CallStart(ctx context.Context, _ idem.CallStart) context.Context { return ctx }
func (noopObserver) CallEnd(context.Context, idem.CallEnd)                           {}

// TestObserverAllocatesNothing checks that the hook adds no allocation: a
// call with a no-op observer allocates exactly what a call without one does,
// on a path that needs no database (an invalid key) and on a replay.
func TestObserverAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t)
	plain, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	observed, err := idem.NewClient(pool, &idem.Config{Observer: noopObserver{}})
	if err != nil {
		t.Fatal(err)
	}
	fn := func(pgx.Tx) (int, error) { return 1, nil }
	refuse := func(pgx.Tx) (int, error) { return 0, idem.Refuse("declined", "declined") }
	if _, err := idem.Do(ctx, plain, "replayed", "h", fn); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, plain, "refused", "h", refuse); err == nil {
		t.Fatal("no refusal")
	}
	n := 1000 // strconv.Itoa allocates from 100 on: every key costs the same
	for _, c := range []struct {
		name string
		key  func() string
		fn   func(pgx.Tx) (int, error)
	}{
		{"invalid key", func() string { return "" }, fn},
		{"replay", func() string { return "replayed" }, fn},
		{"replayed refusal", func() string { return "refused" }, refuse},
		{"first execution", func() string { n++; return "new-" + strconv.Itoa(n) }, fn},
	} {
		allocs := func(db idem.Beginner) float64 {
			return testing.AllocsPerRun(200, func() { _, _ = idem.Do(ctx, db, c.key(), "h", c.fn) })
		}
		without, with := allocs(plain), allocs(observed)
		t.Logf("%s: %.0f allocations without an observer, %.0f with a no-op one", c.name, without, with)
		if with != without && !raceEnabled {
			t.Errorf("%s: %.0f allocations with a no-op observer, %.0f without", c.name, with, without)
		}
	}
}
