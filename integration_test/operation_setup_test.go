package integration_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// The operation under test everywhere: reserve (a database step), charge
// (an external step at a fake processor), receipt (a database step). Its
// tables have no unique constraint, so that a step that ran twice shows as
// two rows instead of being hidden by a conflict.
const opSQL = `
CREATE TABLE op_reservations (key text NOT NULL, amount bigint NOT NULL);
CREATE TABLE op_receipts (key text NOT NULL, charge_id text NOT NULL);
`

type chargeReq struct {
	Amount int64 `json:"amount"`
}

type chargeResp struct {
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
}

// processor is a fake card processor that honours idempotency keys, as
// Stripe does: the first call with a key charges, every later one with
// that key returns the same charge. It counts both.
type processor struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key -> charge id
	calls   int
	keys    []string        // the idempotency key of every call, in order
	voided  map[string]bool // keys voided (Void): a call with one charges nothing
	refunds int             // charges voided after they were made
	// before, if set, runs before the processor acts on a call; after,
	// after it acted and before it answers. Either may block or fail.
	before, after func(ctx context.Context, key string) error
}

func newProcessor() *processor {
	return &processor{charges: map[string]string{}, voided: map[string]bool{}}
}

// errVoided is the processor's answer to a call with a voided key.
var errVoided = errors.New("processor: the idempotency key was voided")

func (p *processor) Charge(ctx context.Context, key string, amount int64) (string, error) {
	p.mu.Lock()
	p.calls++
	p.keys = append(p.keys, key)
	before, after := p.before, p.after
	p.mu.Unlock()
	if before != nil {
		if err := before(ctx, key); err != nil {
			return "", err
		}
	}
	p.mu.Lock()
	if p.voided[key] {
		p.mu.Unlock()
		return "", errVoided
	}
	id, ok := p.charges[key]
	if !ok {
		id = fmt.Sprintf("ch_%d", len(p.charges)+1)
		p.charges[key] = id
	}
	p.mu.Unlock()
	if after != nil {
		if err := after(ctx, key); err != nil {
			return "", err
		}
	}
	return id, nil
}

// Void cancels what key did or will do, as processors let a caller undo by
// idempotency key: a charge made under it is refunded, and a call with it
// that arrives later charges nothing.
func (p *processor) Void(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.charges[key]; ok {
		delete(p.charges, key)
		p.refunds++
	}
	p.voided[key] = true
}

// seen returns the idempotency keys of the calls made, in order.
func (p *processor) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.keys)
}

// charged is how many distinct charges the processor made.
func (p *processor) charged() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

func (p *processor) callCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// opSetup is a fresh database with the operation's tables, a processor,
// and a Client.
type opSetup struct {
	*setup
	proc   *processor
	client *idem.Client
}

func newOpSetup(t *testing.T, cfg *idem.Config) *opSetup {
	t.Helper()
	s := newSetup(t)
	if _, err := s.pool.Exec(context.Background(), opSQL); err != nil {
		t.Fatal(err)
	}
	client, err := idem.NewClient(s.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &opSetup{setup: s, proc: newProcessor(), client: client}
}

// chargeSteps is the operation's function; hooks, if set, run at the named
// points ("reserve", "charge", "receipt": inside the step, before it
// returns) and may fail or block it.
func (s *opSetup) chargeSteps(hooks map[string]func(ctx context.Context) error) func(st *idem.Steps, req chargeReq) (chargeResp, error) {
	hook := func(ctx context.Context, name string) error {
		if h := hooks[name]; h != nil {
			return h(ctx)
		}
		return nil
	}
	return func(st *idem.Steps, req chargeReq) (chargeResp, error) {
		key := st.Key().Key
		if _, err := idem.Step(st, "reserve", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO op_reservations VALUES ($1, $2)", key, req.Amount); err != nil {
				return 0, err
			}
			return req.Amount, hook(ctx, "reserve")
		}); err != nil {
			return chargeResp{}, err
		}
		if req.Amount > 1_000_000 {
			return chargeResp{}, idem.Refuse("amount_too_large", "the amount is above the limit")
		}
		id, err := idem.External(st, "charge", func(ctx context.Context, pkey string) (string, error) {
			id, err := s.proc.Charge(ctx, pkey, req.Amount)
			if err != nil {
				return "", err
			}
			return id, hook(ctx, "charge")
		})
		if err != nil {
			return chargeResp{}, err
		}
		return idem.Step(st, "receipt", func(ctx context.Context, tx pgx.Tx) (chargeResp, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO op_receipts VALUES ($1, $2)", key, id); err != nil {
				return chargeResp{}, err
			}
			return chargeResp{ChargeID: id, Amount: req.Amount}, hook(ctx, "receipt")
		})
	}
}

func (s *opSetup) operation(hooks map[string]func(ctx context.Context) error, cfg *idem.OperationConfig[chargeReq, chargeResp]) *idem.Operation[chargeReq, chargeResp] {
	s.t.Helper()
	op, err := idem.NewOperation(s.client, "charge", s.chargeSteps(hooks), cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	return op
}

// losingCharge is the operation with its charge step failing, as if the
// processor's answer were lost, until answer is called.
func (s *opSetup) losingCharge() (op *idem.Operation[chargeReq, chargeResp], answer func()) {
	var lost atomic.Bool
	lost.Store(true)
	op = s.operation(map[string]func(context.Context) error{
		"charge": func(context.Context) error {
			if lost.Load() {
				return errors.New("the processor's answer was lost")
			}
			return nil
		},
	}, nil)
	return op, func() { lost.Store(false) }
}

// stoppedAtCharge runs losingCharge's operation under key until its charge
// step fails, which leaves the operation unfinished after its first step.
func (s *opSetup) stoppedAtCharge(key string, amount int64) (op *idem.Operation[chargeReq, chargeResp], answer func()) {
	s.t.Helper()
	op, answer = s.losingCharge()
	if _, _, err := op.Run(context.Background(), key, chargeReq{Amount: amount}); err == nil {
		s.t.Fatal("Run succeeded; want it to stop after the charge")
	}
	return op, answer
}

// rowsOf counts the rows of key in each step's table.
func (s *opSetup) rowsOf(key string) (reservations, receipts int) {
	return s.count("SELECT count(*) FROM op_reservations WHERE key = $1", key),
		s.count("SELECT count(*) FROM op_receipts WHERE key = $1", key)
}

// unfinished counts the operations not finished.
func (s *opSetup) unfinished() int {
	return s.count("SELECT count(*) FROM idempotency_keys WHERE status = 'unfinished'") +
		s.count("SELECT count(*) FROM idempotency_keys_operations")
}
