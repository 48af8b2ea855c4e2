package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// records is a slog.Handler that keeps records and tells when one arrives.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
	got  chan struct{}
}

func newRecords() *records { return &records{got: make(chan struct{}, 100)} }

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *records) WithGroup(string) slog.Handler            { return h }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	h.got <- struct{}{}
	return nil
}

func (h *records) errors() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.recs {
		if r.Level == slog.LevelError {
			out = append(out, r)
		}
	}
	return out
}

// TestFailedSweepsAreReported checks that SweepEvery hands every failed
// sweep to Config.Logger and to onError, and to slog.Default() when it has
// neither.
func TestFailedSweepsAreReported(t *testing.T) {
	// Port 1 on the loopback refuses connections at once.
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// sweep runs SweepEvery until two sweeps failed (the first at once, the
	// second after an interval) and returns what onError received.
	sweep := func(t *testing.T, logger *slog.Logger, h *records, withOnError bool) []error {
		t.Helper()
		keys, err := idem.NewClient(pool, &idem.Config{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var (
			mu     sync.Mutex
			failed []error
		)
		var onError func(error)
		if withOnError {
			onError = func(err error) {
				mu.Lock()
				defer mu.Unlock()
				failed = append(failed, err)
				if len(failed) == 2 && h == nil {
					cancel()
				}
			}
		}
		done := make(chan error)
		go func() { done <- keys.SweepEvery(ctx, 10*time.Millisecond, onError) }()
		if h != nil {
			for range 2 {
				<-h.got
			}
			cancel()
		}
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("SweepEvery returned %v, want context.Canceled", err)
		}
		mu.Lock()
		defer mu.Unlock()
		return failed
	}
	wantRecords := func(t *testing.T, h *records) {
		t.Helper()
		recs := h.errors()
		if len(recs) < 2 {
			t.Fatalf("%d error records, want one per failed sweep (2 or more)", len(recs))
		}
		for _, r := range recs {
			var cause error
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "err" {
					cause, _ = a.Value.Any().(error)
				}
				return true
			})
			if cause == nil {
				t.Fatalf("record %q carries no error", r.Message)
			}
		}
	}

	t.Run("Logger", func(t *testing.T) {
		h := newRecords()
		if failed := sweep(t, slog.New(h), h, false); len(failed) != 0 {
			t.Fatalf("onError got %v without being given", failed)
		}
		wantRecords(t, h)
	})
	t.Run("Logger and onError", func(t *testing.T) {
		h := newRecords()
		failed := sweep(t, slog.New(h), h, true)
		wantRecords(t, h)
		if len(failed) < 2 {
			t.Fatalf("onError got %d failures, want every failed sweep", len(failed))
		}
	})
	t.Run("onError alone", func(t *testing.T) {
		if failed := sweep(t, nil, nil, true); len(failed) < 2 {
			t.Fatalf("onError got %d failures, want 2", len(failed))
		}
	})
	t.Run("neither: slog.Default", func(t *testing.T) {
		h := newRecords()
		prev := slog.Default()
		slog.SetDefault(slog.New(h))
		defer slog.SetDefault(prev)
		sweep(t, nil, h, false)
		wantRecords(t, h)
	})
}
