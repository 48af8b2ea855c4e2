package idemriver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemriver"
	"github.com/idemhq/idem/testkit/testdb"
)

// liveness bounds the waits for the completer: not a timing assertion,
// only a limit on a broken run. River's scheduler makes a scheduled job
// available up to 5 s after its time.
const liveness = 60 * time.Second

// The operation under test: reserve (a database step), charge (an
// external step at a fake processor), receipt (a database step), and, for
// an operation past its deadline, refund (its compensation's database
// step). The tables have no unique constraint, so that a step that ran
// twice shows as two rows.
const tablesSQL = `
CREATE TABLE reservations (key text NOT NULL, amount bigint NOT NULL);
CREATE TABLE receipts (key text NOT NULL, charge_id text NOT NULL);
CREATE TABLE refunds (key text NOT NULL, amount bigint NOT NULL);
`

type chargeReq struct {
	Amount int64 `json:"amount"`
}

type chargeResp struct {
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
}

// processor is a fake card processor that honours idempotency keys: the
// first call with a key charges, every later one returns that charge.
type processor struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key -> charge id
	calls   int
	// before, if set, runs before the processor acts on a call; after,
	// after it acted and before it answers. Either may block or fail.
	before, after func(ctx context.Context) error
}

func (p *processor) Charge(ctx context.Context, key string) (string, error) {
	p.mu.Lock()
	p.calls++
	before, after := p.before, p.after
	p.mu.Unlock()
	if before != nil {
		if err := before(ctx); err != nil {
			return "", err
		}
	}
	p.mu.Lock()
	id, ok := p.charges[key]
	if !ok {
		id = fmt.Sprintf("ch_%d", len(p.charges)+1)
		p.charges[key] = id
	}
	p.mu.Unlock()
	if after != nil {
		if err := after(ctx); err != nil {
			return "", err
		}
	}
	return id, nil
}

// callCount returns how many calls the processor received.
func (p *processor) callCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// charged returns the charges made, and the id of the charge if there is
// exactly one ("" otherwise): an operation's one run charges under one
// derived key, whichever owner called.
func (p *processor) charged() (int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := ""
	for _, v := range p.charges {
		id = v
	}
	if len(p.charges) != 1 {
		id = ""
	}
	return len(p.charges), id
}

// fixture is a database with idem's and River's tables and the
// operation's, a fake processor, and a River client that works the
// completer's queue once started.
type fixture struct {
	t       *testing.T
	pool    *pgxpool.Pool
	keys    *idem.Client
	workers *river.Workers
	river   *river.Client[pgx.Tx]
	proc    *processor
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := t.Context()
	pool := testdb.New(t)
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, tablesSQL); err != nil {
		t.Fatal(err)
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, pool: pool, keys: keys, workers: river.NewWorkers(), proc: &processor{charges: map[string]string{}}}
	f.river, err = river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{idemriver.QueueName: {MaxWorkers: 4}},
		Workers:           f.workers,
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
		TestOnly:          true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// start registers the completer of ops and starts the River client,
// stopped when the test ends.
func (f *fixture) start(ops ...idem.Resumer) {
	f.t.Helper()
	w, err := idemriver.NewWorker(ops...)
	if err != nil {
		f.t.Fatal(err)
	}
	river.AddWorker(f.workers, w)
	if err := f.river.Start(context.WithoutCancel(f.t.Context())); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), liveness)
		defer cancel()
		if err := f.river.Stop(ctx); err != nil {
			f.t.Error(err)
		}
	})
}

// steps is the operation's function. between, if set, runs after the
// reserve step and before the processor call; inReserve inside the
// reserve step's transaction, before it commits.
func (f *fixture) steps(inReserve, between func(ctx context.Context) error) func(s *idem.Steps, req chargeReq) (chargeResp, error) {
	return func(s *idem.Steps, req chargeReq) (chargeResp, error) {
		key := s.Key().Key
		if _, err := idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO reservations VALUES ($1, $2)", key, req.Amount); err != nil {
				return 0, err
			}
			if inReserve != nil {
				if err := inReserve(ctx); err != nil {
					return 0, err
				}
			}
			return req.Amount, nil
		}); err != nil {
			return chargeResp{}, err
		}
		if between != nil {
			if err := between(s.Context()); err != nil {
				return chargeResp{}, err
			}
		}
		id, err := idem.External(s, "charge", f.proc.Charge)
		if err != nil {
			return chargeResp{}, err
		}
		return idem.Step(s, "receipt", func(ctx context.Context, tx pgx.Tx) (chargeResp, error) {
			_, err := tx.Exec(ctx, "INSERT INTO receipts VALUES ($1, $2)", key, id)
			return chargeResp{ChargeID: id, Amount: req.Amount}, err
		})
	}
}

// refund is the compensation of an operation past its deadline: it gives
// back what the reserve step took, and refuses.
func refund(s *idem.Steps, _ chargeReq, cause error) (chargeResp, error) {
	amount, reserved, err := idem.Recorded[int64](s, "reserve")
	if err != nil {
		return chargeResp{}, err
	}
	if reserved {
		if _, err := idem.Step(s, "refund", func(ctx context.Context, tx pgx.Tx) (bool, error) {
			_, err := tx.Exec(ctx, "INSERT INTO refunds VALUES ($1, $2)", s.Key().Key, amount)
			return true, err
		}); err != nil {
			return chargeResp{}, err
		}
	}
	return chargeResp{}, idem.Refuse("expired", cause.Error())
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// rows counts key's rows in each step's table.
func (f *fixture) rows(key string) (reservations, receipts, refunds int) {
	return f.count("SELECT count(*) FROM reservations WHERE key = $1", key),
		f.count("SELECT count(*) FROM receipts WHERE key = $1", key),
		f.count("SELECT count(*) FROM refunds WHERE key = $1", key)
}

// unfinished returns idem's count of unfinished operations.
func (f *fixture) unfinished() int64 {
	f.t.Helper()
	st, err := f.keys.Stats(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return st.Unfinished
}

// job waits until the completer job of key has ended (completed,
// cancelled or discarded) and returns it.
func (f *fixture) job(key string) *rivertype.JobRow {
	f.t.Helper()
	ctx := context.Background()
	var id int64
	if err := f.pool.QueryRow(ctx, "SELECT id FROM river_job WHERE kind = $1 AND args->>'key' = $2",
		idemriver.CompleteArgs{}.Kind(), key).Scan(&id); err != nil {
		f.t.Fatalf("the completer job of %q: %v", key, err)
	}
	deadline := time.Now().Add(liveness)
	for {
		job, err := f.river.JobGet(ctx, id)
		if err != nil {
			f.t.Fatal(err)
		}
		switch job.State {
		case rivertype.JobStateCompleted, rivertype.JobStateCancelled, rivertype.JobStateDiscarded:
			return job
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the completer job of %q is still %s after %v (errors %v)", key, job.State, liveness, job.Errors)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outcome returns the Result a finished completer job recorded.
func outcome(t *testing.T, job *rivertype.JobRow) string {
	t.Helper()
	var r idemriver.Result
	if out := job.Output(); out != nil {
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatal(err)
		}
	}
	return r.Outcome
}
