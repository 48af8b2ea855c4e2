package idemconsume_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/testkit/testdb"
)

// settler records what Process told the broker.
type settler struct {
	mu      sync.Mutex
	actions []string
	delay   time.Duration
	reason  error
}

func (s *settler) add(a string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.actions = append(s.actions, a)
}

func (s *settler) Ack(context.Context) error { s.add("ack"); return nil }

func (s *settler) Retry(_ context.Context, d time.Duration) error {
	s.mu.Lock()
	s.delay = d
	s.mu.Unlock()
	s.add("retry")
	return nil
}

func (s *settler) DeadLetter(_ context.Context, reason error) error {
	s.mu.Lock()
	s.reason = reason
	s.mu.Unlock()
	s.add("dead_letter")
	return nil
}

func (s *settler) settled() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.actions...)
}

// effectsSQL has no unique constraint, so that a message processed twice
// shows as two rows.
const effectsSQL = `CREATE TABLE effects (consumer text NOT NULL, payload text NOT NULL)`

// fixture is a database with the effects table and a handler that writes
// one effect row, or fails as its fail function says.
type fixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	count *idemconsume.Counters
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testdb.New(t)
	if _, err := pool.Exec(t.Context(), effectsSQL); err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, pool: pool, count: &idemconsume.Counters{}}
}

// with returns f for a subtest t: the same database and counters. The
// subtests of one test use consumer names of their own.
func (f *fixture) with(t *testing.T) *fixture { return &fixture{t: t, pool: f.pool, count: f.count} }

// consumer returns a consumer named name whose handler records an effect
// and then calls then (if set), whose error it returns.
func (f *fixture) consumer(name string, then func(ctx context.Context, m *idemconsume.Message) error) *idemconsume.Consumer {
	f.t.Helper()
	c, err := idemconsume.New(f.pool, &idemconsume.Config{
		Name: name, MaxDeliveries: 3, InProgressDelay: 50 * time.Millisecond,
		Backoff:  func(n int) time.Duration { return time.Duration(n) * time.Millisecond },
		Observer: f.count,
	}, func(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
		if _, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1, $2)", name, string(m.Payload)); err != nil {
			return err
		}
		if then != nil {
			return then(ctx, m)
		}
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *fixture) effects(consumer, payload string) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM effects WHERE consumer = $1 AND payload = $2", consumer, payload).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func (f *fixture) process(c *idemconsume.Consumer, m *idemconsume.Message) (idemconsume.Result, *settler) {
	f.t.Helper()
	s := &settler{}
	res, err := c.Process(f.t.Context(), m, s)
	if err != nil {
		f.t.Fatalf("Process: %v", err)
	}
	if got := s.settled(); len(got) != 1 || got[0] != res.Action.String() {
		f.t.Fatalf("settled %v, want exactly one %s", got, res.Action)
	}
	return res, s
}

func TestProcess(t *testing.T) {
	t.Parallel()
	shared := newFixture(t)
	t.Run("executed, then a redelivery is a duplicate", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		c := f.consumer("ledger1", nil)
		m := &idemconsume.Message{ID: "evt-1", Payload: []byte("a")}
		if res, _ := f.process(c, m); res.Action != idemconsume.Ack || res.Outcome != idem.OutcomeExecuted {
			t.Fatalf("first delivery: %+v", res)
		}
		m.Deliveries = 2
		if res, _ := f.process(c, m); res.Action != idemconsume.Ack || res.Outcome != idem.OutcomeReplayed {
			t.Fatalf("redelivery: %+v", res)
		}
		if n := f.effects("ledger1", "a"); n != 1 {
			t.Fatalf("%d effects, want 1", n)
		}
		if got := f.count.Get("ledger1"); got.Processed != 1 || got.Duplicates != 1 || got.Redeliveries != 1 {
			t.Fatalf("counts %+v", got)
		}
	})
	t.Run("two consumers of one message each process it once", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		a, b := f.consumer("ledger2", nil), f.consumer("mailer2", nil)
		m := &idemconsume.Message{ID: "evt-1", Payload: []byte("a")}
		for range 2 {
			f.process(a, m)
			f.process(b, m)
		}
		if na, nb := f.effects("ledger2", "a"), f.effects("mailer2", "a"); na != 1 || nb != 1 {
			t.Fatalf("effects %d and %d, want 1 each", na, nb)
		}
	})
	t.Run("the producer id is the key, not the position", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		c := f.consumer("ledger3", nil)
		// A producer's retried publish: the same id at a new position.
		f.process(c, &idemconsume.Message{ID: "evt-1", Position: "t/0/7", Payload: []byte("a")})
		res, _ := f.process(c, &idemconsume.Message{ID: "evt-1", Position: "t/0/9", Payload: []byte("a")})
		if res.Outcome != idem.OutcomeReplayed || f.effects("ledger3", "a") != 1 {
			t.Fatalf("second publish: %+v, %d effects; want a replay and 1 effect", res, f.effects("ledger3", "a"))
		}
		// Without an id, the position keys: a redelivery of one publish.
		f.process(c, &idemconsume.Message{Position: "t/0/11", Payload: []byte("b")})
		res, _ = f.process(c, &idemconsume.Message{Position: "t/0/11", Payload: []byte("b"), Deliveries: 2})
		if res.Outcome != idem.OutcomeReplayed || f.effects("ledger3", "b") != 1 {
			t.Fatalf("redelivery by position: %+v, %d effects", res, f.effects("ledger3", "b"))
		}
	})
	t.Run("a refusal is stored and acked", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		c := f.consumer("ledger4", func(context.Context, *idemconsume.Message) error {
			return idem.Refuse("unknown_account", "no such account")
		})
		m := &idemconsume.Message{ID: "evt-1", Payload: []byte("a")}
		res, _ := f.process(c, m)
		if res.Action != idemconsume.Ack || res.Outcome != idem.OutcomeRefused {
			t.Fatalf("first delivery: %+v", res)
		}
		res, _ = f.process(c, m)
		if res.Action != idemconsume.Ack || res.Outcome != idem.OutcomeReplayed || !errors.Is(res.Err, idem.Refuse("unknown_account", "")) {
			t.Fatalf("redelivery: %+v", res)
		}
		if n := f.effects("ledger4", "a"); n != 0 {
			t.Fatalf("%d effects of a refusal, want 0", n)
		}
	})
	t.Run("another payload under a used key is dead-lettered", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		c := f.consumer("ledger5", nil)
		f.process(c, &idemconsume.Message{ID: "evt-1", Payload: []byte("a")})
		res, s := f.process(c, &idemconsume.Message{ID: "evt-1", Payload: []byte("b")})
		if res.Action != idemconsume.DeadLetter || !errors.Is(s.reason, idem.ErrMismatch) {
			t.Fatalf("%+v, reason %v; want a dead letter for ErrMismatch", res, s.reason)
		}
		if f.effects("ledger5", "b") != 0 || f.count.Get("ledger5").Mismatches != 1 {
			t.Fatal("the mismatched payload ran, or was not counted")
		}
	})
	t.Run("a failure is retried with backoff, then dead-lettered", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		c := f.consumer("ledger6", func(context.Context, *idemconsume.Message) error { return errors.New("poison") })
		m := &idemconsume.Message{ID: "evt-1", Payload: []byte("a")}
		for n := 1; n <= 3; n++ {
			m.Deliveries = n
			res, s := f.process(c, m)
			if n < 3 && (res.Action != idemconsume.Retry || s.delay != time.Duration(n)*time.Millisecond) {
				t.Fatalf("delivery %d: %+v, delay %v", n, res, s.delay)
			}
			if n == 3 && (res.Action != idemconsume.DeadLetter || !errors.Is(s.reason, idemconsume.ErrDeliveryLimit)) {
				t.Fatalf("last delivery: %+v, reason %v", res, s.reason)
			}
		}
		if n := f.effects("ledger6", "a"); n != 0 {
			t.Fatalf("%d effects of a failing handler, want 0", n)
		}
	})
	t.Run("a message without a key is dead-lettered", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		res, s := f.process(f.consumer("ledger7", nil), &idemconsume.Message{Payload: []byte("a")})
		if res.Action != idemconsume.DeadLetter || !errors.Is(s.reason, idemconsume.ErrNoKey) {
			t.Fatalf("%+v, reason %v", res, s.reason)
		}
	})
}

// TestInProgressRetried: a delivery that finds its key held by another
// delivery (another instance, after a rebalance) is retried later, never
// acked: the holder may still fail.
func TestInProgressRetried(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	holding, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c := f.consumer("ledger", func(ctx context.Context, m *idemconsume.Message) error {
		first := false
		once.Do(func() { first = true })
		if first {
			close(holding)
			<-release
			return errors.New("the holder fails after all")
		}
		return nil
	})
	m := &idemconsume.Message{ID: "evt-1", Payload: []byte("a")}
	done := make(chan idemconsume.Result)
	go func() {
		res, _ := c.Process(context.Background(), m, &settler{})
		done <- res
	}()
	<-holding
	res, s := f.process(c, &idemconsume.Message{ID: "evt-1", Payload: []byte("a"), Deliveries: 2})
	close(release)
	if first := <-done; first.Action != idemconsume.Retry {
		t.Fatalf("the holder: %+v", first)
	}
	if res.Action != idemconsume.Retry || res.Outcome != idem.OutcomeInProgress || s.delay != 50*time.Millisecond {
		t.Fatalf("the second delivery: %+v, delay %v; want a retry after InProgressDelay", res, s.delay)
	}
	// The redelivery the retry asked for runs the handler: nothing lost.
	f.process(c, &idemconsume.Message{ID: "evt-1", Payload: []byte("a"), Deliveries: 3})
	if n := f.effects("ledger", "a"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if got := f.count.Get("ledger"); got.InProgress != 1 {
		t.Fatalf("counts %+v", got)
	}
}

// TestSettledAfterCommit: nothing reaches the broker before the handler's
// transaction answered, and nothing at all when the consumer stops
// mid-handler: the broker redelivers, and the redelivery does the work.
func TestSettledAfterCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := &settler{}
	var early []string
	c := f.consumer("ledger", func(ctx context.Context, m *idemconsume.Message) error {
		early = s.settled()
		if string(m.Payload) == "crash" {
			<-ctx.Done() // the consumer is stopped mid-handler
			return ctx.Err()
		}
		return nil
	})
	if _, err := c.Process(t.Context(), &idemconsume.Message{ID: "evt-1", Payload: []byte("a")}, s); err != nil {
		t.Fatal(err)
	}
	if len(early) != 0 {
		t.Fatalf("the broker was told %v while the transaction was open", early)
	}

	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	s = &settler{}
	m := &idemconsume.Message{ID: "evt-2", Payload: []byte("crash"), Deliveries: 3}
	if _, err := c.Process(ctx, m, s); !errors.Is(err, context.Canceled) {
		t.Fatalf("Process of a stopped consumer returned %v", err)
	}
	if got := s.settled(); len(got) != 0 {
		t.Fatalf("a delivery whose transaction never answered was settled: %v", got)
	}
	if n := f.effects("ledger", "crash"); n != 0 {
		t.Fatalf("%d effects of a rolled-back delivery", n)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	h := func(context.Context, pgx.Tx, *idemconsume.Message) error { return nil }
	db := &pgxpool.Pool{}
	for name, tc := range map[string]struct {
		db  idem.Beginner
		cfg *idemconsume.Config
		h   idemconsume.Handler
	}{
		"no database":      {nil, &idemconsume.Config{Name: "a"}, h},
		"no handler":       {db, &idemconsume.Config{Name: "a"}, nil},
		"no config":        {db, nil, h},
		"no name":          {db, &idemconsume.Config{}, h},
		"name with a tab":  {db, &idemconsume.Config{Name: "a\tb"}, h},
		"negative retries": {db, &idemconsume.Config{Name: "a", MaxDeliveries: -1}, h},
	} {
		if _, err := idemconsume.New(tc.db, tc.cfg, tc.h); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}
