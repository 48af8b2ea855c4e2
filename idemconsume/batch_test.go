package idemconsume_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
)

// batch is one delivery of a batch: its messages, a settler each.
type batch struct {
	ms []*idemconsume.Message
	ss []*settler
}

func newBatch(payloads ...string) *batch {
	b := &batch{}
	for _, p := range payloads {
		b.ms = append(b.ms, &idemconsume.Message{ID: "id-" + p, Payload: []byte(p)})
		b.ss = append(b.ss, &settler{})
	}
	return b
}

// redeliver returns the batch delivered again: the same messages, each one
// delivery further, with fresh settlers.
func (b *batch) redeliver() *batch {
	r := &batch{}
	for _, m := range b.ms {
		again := *m
		again.Deliveries = max(m.Deliveries, 1) + 1
		r.ms = append(r.ms, &again)
		r.ss = append(r.ss, &settler{})
	}
	return r
}

// processBatch runs c.ProcessBatch over b and checks that each message was
// settled as its result says, exactly once, or not at all when ctx ended.
func (f *fixture) processBatch(ctx context.Context, c *idemconsume.Consumer, b *batch) []idemconsume.Result {
	f.t.Helper()
	calls := make([]int, len(b.ms))
	res, errs := c.ProcessBatch(ctx, b.ms, func(i int) idemconsume.Settler { calls[i]++; return b.ss[i] })
	if len(res) != len(b.ms) || len(errs) != len(b.ms) {
		f.t.Fatalf("%d results and %d errors for %d messages", len(res), len(errs), len(b.ms))
	}
	for i := range b.ms {
		got := b.ss[i].settled()
		switch {
		case errs[i] != nil && ctx.Err() != nil:
			if len(got) != 0 || calls[i] != 0 {
				f.t.Fatalf("message %d settled %v after ctx ended", i, got)
			}
		case errs[i] != nil:
			f.t.Fatalf("message %d: %v", i, errs[i])
		case len(got) != 1 || got[0] != res[i].Action.String() || calls[i] != 1:
			f.t.Fatalf("message %d settled %v (%d settlers), want exactly one %s", i, got, calls[i], res[i].Action)
		}
	}
	return res
}

func actions(res []idemconsume.Result) []idemconsume.Action {
	out := make([]idemconsume.Action, len(res))
	for i, r := range res {
		out[i] = r.Action
	}
	return out
}

func TestProcessBatch(t *testing.T) {
	t.Parallel()
	shared := newFixture(t)
	t.Run("a failing message rolls back alone and is retried", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		c := f.consumer("batch1", func(_ context.Context, m *idemconsume.Message) error {
			if string(m.Payload) == "b" {
				return errors.New("technical failure")
			}
			return nil
		})
		b := newBatch("a", "b", "c")
		res := f.processBatch(t.Context(), c, b)
		want := []idemconsume.Action{idemconsume.Ack, idemconsume.Retry, idemconsume.Ack}
		if !slices.Equal(actions(res), want) || res[1].Outcome != idem.OutcomeFailed {
			t.Fatalf("%+v; want ack, retry, ack", res)
		}
		if a, b, c := f.effects("batch1", "a"), f.effects("batch1", "b"), f.effects("batch1", "c"); a != 1 || b != 0 || c != 1 {
			t.Fatalf("effects a=%d b=%d c=%d, want 1, 0, 1", a, b, c)
		}
		// The redelivery of the whole batch: a and c replay, b fails again.
		res = f.processBatch(t.Context(), c, b.redeliver())
		if res[0].Outcome != idem.OutcomeReplayed || res[2].Outcome != idem.OutcomeReplayed || f.effects("batch1", "a") != 1 {
			t.Fatalf("redelivery: %+v", res)
		}
	})
	t.Run("a duplicate inside the batch executes once", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		c := f.consumer("batch2", nil)
		b := newBatch("a", "b", "a")
		res := f.processBatch(t.Context(), c, b)
		if !slices.Equal(actions(res), []idemconsume.Action{idemconsume.Ack, idemconsume.Ack, idemconsume.Ack}) || res[0].Outcome != idem.OutcomeExecuted || res[2].Outcome != idem.OutcomeReplayed {
			t.Fatalf("%+v; want the second a replayed", res)
		}
		if n := f.effects("batch2", "a"); n != 1 {
			t.Fatalf("%d effects of a, want 1", n)
		}
	})
	t.Run("a refusal is stored and acked", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		c := f.consumer("batch3", func(_ context.Context, m *idemconsume.Message) error {
			if string(m.Payload) == "b" {
				return idem.Refuse("unknown_account", "no such account")
			}
			return nil
		})
		res := f.processBatch(t.Context(), c, newBatch("a", "b", "c"))
		if !slices.Equal(actions(res), []idemconsume.Action{idemconsume.Ack, idemconsume.Ack, idemconsume.Ack}) || res[1].Outcome != idem.OutcomeRefused {
			t.Fatalf("%+v", res)
		}
		if f.effects("batch3", "b") != 0 || f.effects("batch3", "c") != 1 {
			t.Fatal("the refusal's writes committed, or the next message's did not")
		}
	})
	t.Run("another payload under a used key is dead-lettered", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		c := f.consumer("batch4", nil)
		b := newBatch("a", "b", "c")
		b.ms[2].ID = b.ms[0].ID // c under a's key
		b.ms = append(b.ms, &idemconsume.Message{Payload: []byte("no key")})
		b.ss = append(b.ss, &settler{})
		res := f.processBatch(t.Context(), c, b)
		if !slices.Equal(actions(res), []idemconsume.Action{idemconsume.Ack, idemconsume.Ack, idemconsume.DeadLetter, idemconsume.DeadLetter}) ||
			!errors.Is(b.ss[2].reason, idem.ErrMismatch) || !errors.Is(b.ss[3].reason, idemconsume.ErrNoKey) {
			t.Fatalf("%+v; want c dead-lettered for ErrMismatch, the last for ErrNoKey", res)
		}
		if f.effects("batch4", "c") != 0 || f.effects("batch4", "a") != 1 {
			t.Fatal("the mismatched payload ran, or the first did not")
		}
	})
	t.Run("a key in progress elsewhere is retried without waiting", func(t *testing.T) {
		t.Parallel()
		f := shared.with(t)
		holding, release := make(chan struct{}), make(chan struct{})
		c := f.consumer("batch5", func(_ context.Context, m *idemconsume.Message) error {
			if string(m.Payload) == "held" {
				close(holding)
				<-release
			}
			return nil
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = c.Process(context.Background(), &idemconsume.Message{ID: "id-b", Payload: []byte("held")}, &settler{})
		}()
		<-holding
		b := newBatch("a", "b", "c")
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // the holder waits for us: a wait would never end
		defer cancel()
		res := f.processBatch(ctx, c, b)
		close(release)
		<-done
		if !slices.Equal(actions(res), []idemconsume.Action{idemconsume.Ack, idemconsume.Retry, idemconsume.Ack}) || res[1].Outcome != idem.OutcomeInProgress || b.ss[1].delay != 50*time.Millisecond {
			t.Fatalf("%+v; want b retried after InProgressDelay", res)
		}
		if f.effects("batch5", "a") != 1 || f.effects("batch5", "c") != 1 {
			t.Fatal("the batch's other messages did not commit")
		}
	})
}

// TestProcessBatchFailsWhole: when the batch's transaction cannot commit as
// a whole, no message is acked, and the redelivery of the batch makes every
// message's effect exactly once.
func TestProcessBatchFailsWhole(t *testing.T) {
	t.Parallel()
	shared := newFixture(t)
	// A row of fail_at_commit fails COMMIT (a deferred foreign key); a row
	// of die_at_commit ends the session in COMMIT, before it answered.
	if _, err := shared.pool.Exec(t.Context(), `
		CREATE TABLE nothing (x int PRIMARY KEY);
		CREATE TABLE fail_at_commit (x int REFERENCES nothing DEFERRABLE INITIALLY DEFERRED);
		CREATE TABLE die_at_commit (x int);
		CREATE FUNCTION die() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER die AFTER INSERT ON die_at_commit DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION die()`); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name string
		// fault runs in b's handler, in the batch's transaction.
		fault   func(t *testing.T, f *fixture, ctx context.Context, tx pgx.Tx) error
		outcome idem.Outcome
	}{
		{"the backend is terminated mid-batch", func(t *testing.T, f *fixture, ctx context.Context, tx pgx.Tx) error {
			var pid int
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			if _, err := f.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				t.Error(err)
			}
			_, err := tx.Exec(ctx, "SELECT pg_sleep(1)") // the session dies under it
			return err
		}, idem.OutcomeFailed},
		{"a deadlock in one message", func(_ *testing.T, _ *fixture, ctx context.Context, tx pgx.Tx) error {
			// Its savepoint undoes the statement, not the conflict.
			_, err := tx.Exec(ctx, "DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$")
			return err
		}, idem.OutcomeFailed},
		{"COMMIT fails", func(_ *testing.T, _ *fixture, ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO fail_at_commit VALUES (1)")
			return err
		}, idem.OutcomeFailed},
		{"COMMIT's outcome is unknown", func(_ *testing.T, _ *fixture, ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO die_at_commit VALUES (1)")
			return err
		}, idem.OutcomeUnknown},
	} {
		name := fmt.Sprintf("whole%d", i)
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := shared.with(t)
			faulty := true
			var pid int // the backend that ran the batch
			var mu sync.Mutex
			c, err := idemconsume.New(f.pool, &idemconsume.Config{Name: name, MaxDeliveries: 1,
				Backoff: func(n int) time.Duration { return time.Duration(n) * time.Millisecond }},
				func(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
					if _, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1, $2)", name, string(m.Payload)); err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					if string(m.Payload) == "b" && faulty {
						faulty = false
						if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
							return err
						}
						return tc.fault(t, f, ctx, tx)
					}
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			b := newBatch("a", "b", "c")
			res := f.processBatch(t.Context(), c, b)
			for i, r := range res {
				if r.Action != idemconsume.Retry || r.Outcome != tc.outcome || !errors.Is(r.Err, idemconsume.ErrBatchFailed) {
					t.Fatalf("message %d: %+v; want a retry with ErrBatchFailed, outcome %s, and no dead letter at MaxDeliveries 1", i, r, tc.outcome)
				}
			}
			for _, p := range []string{"a", "b", "c"} {
				if n := f.effects(name, p); n != 0 {
					t.Fatalf("%d effects of %s after a failed batch", n, p)
				}
			}
			// A terminated backend tells its client before it has released
			// its locks; the broker's redelivery comes later than that.
			waitIdle(t, f.pool, pid)
			res = f.processBatch(t.Context(), c, b.redeliver())
			for _, p := range []string{"a", "b", "c"} {
				if n := f.effects(name, p); n != 1 {
					t.Fatalf("redelivery: %d effects of %s, want 1; %+v", n, p, res)
				}
			}
		})
	}
}

// waitIdle waits until the backend pid has ended or is idle, so it holds
// no lock.
func waitIdle(t *testing.T, pool *pgxpool.Pool, pid int) {
	t.Helper()
	for {
		var busy bool
		err := pool.QueryRow(t.Context(),
			"SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle')", pid).Scan(&busy)
		if err != nil {
			t.Fatal(err)
		}
		if !busy {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestProcessBatchStopped: a batch whose ctx ends mid-handler commits
// nothing and settles nothing; the broker redelivers.
func TestProcessBatchStopped(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.consumer("stopped", func(ctx context.Context, m *idemconsume.Message) error {
		if string(m.Payload) == "b" {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	b := newBatch("a", "b", "c")
	b.ms = append(b.ms, &idemconsume.Message{Payload: []byte("no key")})
	b.ss = append(b.ss, &settler{})
	res := f.processBatch(ctx, c, b)
	if !slices.Equal(actions(res), []idemconsume.Action{idemconsume.Retry, idemconsume.Retry, idemconsume.Retry, idemconsume.DeadLetter}) {
		t.Fatalf("%+v", res)
	}
	if got := b.ss[3].settled(); len(got) != 1 {
		t.Fatalf("the message without a key: settled %v, want a dead letter", got)
	}
	if n := f.effects("stopped", "a"); n != 0 {
		t.Fatalf("%d effects of a stopped batch", n)
	}
}
