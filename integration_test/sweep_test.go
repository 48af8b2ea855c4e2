package integration_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// seedKeys stores live and expired keys through Do, then ages the expired.
func seedKeys(t *testing.T, s *setup, live, expired int) {
	t.Helper()
	ctx := context.Background()
	fn := func(pgx.Tx) (int, error) { return 1, nil }
	for i := 0; i < live+expired; i++ {
		if _, err := idem.Do(ctx, s.pool, fmt.Sprintf("k%03d", i), "h", fn); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.pool.Exec(ctx, "UPDATE idempotency_keys SET expires_at = now() - interval '1 minute' WHERE idempotency_key < $1", fmt.Sprintf("k%03d", expired)); err != nil {
		t.Fatal(err)
	}
}

func TestSweepDeletesOnlyExpiredInBatches(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	seedKeys(t, s, 5, 23)
	// 23 expired keys in statements of at most 4: Sweep goes on until a
	// batch comes back short.
	sweeper, err := idem.NewClient(s.pool, &idem.Config{SweepBatchSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := sweeper.Sweep(context.Background())
	if err != nil || deleted != 23 {
		t.Fatalf("deleted %d, %v; want 23", deleted, err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 5 {
		t.Fatalf("%d keys left, want the 5 live ones", n)
	}
	if _, err := idem.NewClient(s.pool, &idem.Config{SweepBatchSize: -1}); !errors.Is(err, idem.ErrInvalidOption) {
		t.Fatalf("batch size -1: %v, want ErrInvalidOption", err)
	}
}

func TestSweepEveryRunsUntilCancelled(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	seedKeys(t, s, 2, 10)
	sweeper, err := idem.NewClient(s.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sweeper.SweepEvery(ctx, 10*time.Millisecond, func(err error) { t.Error(err) }) }()
	for deadline := time.Now().Add(time.Minute); s.count("SELECT count(*) FROM idempotency_keys") != 2; {
		if time.Now().After(deadline) {
			t.Fatal("the background sweeper did not delete the expired keys")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("SweepEvery returned %v, want context.Canceled", err)
	}
}
