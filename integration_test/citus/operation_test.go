package citus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// processor is a card processor that honours idempotency keys: a call
// repeated with a key it has seen returns the first answer and charges
// nothing more.
type processor struct {
	mu      sync.Mutex
	calls   int
	charges map[string]string // key -> charge id
}

func newProcessor() *processor { return &processor{charges: map[string]string{}} }

func (p *processor) charge(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if id, ok := p.charges[key]; ok {
		return id
	}
	id := fmt.Sprintf("ch_%d", len(p.charges)+1)
	p.charges[key] = id
	return id
}

func (p *processor) counts() (calls, charges int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, len(p.charges)
}

type payment struct {
	Amount int64 `json:"amount"`
}

type receipt struct {
	Charge  charge `json:"charge"`
	Payment string `json:"payment"`
}

// payOperation reserves the amount on the tenant's account in a database
// step, then charges the processor in an external step; inCall, if set,
// runs inside the external step before the processor is called.
func payOperation(t *testing.T, n *node, scope string, proc *processor, lease time.Duration, inCall func(ctx context.Context)) *idem.Operation[payment, receipt] {
	t.Helper()
	client, err := idem.NewClient(n.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	op, err := idem.NewOperation(client, "pay", func(s *idem.Steps, p payment) (receipt, error) {
		key := s.Key()
		ch, err := idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (charge, error) {
			runs := 0
			return chargeFn(ctx, scope, key.Key, p.Amount, &runs)(tx)
		})
		if err != nil {
			return receipt{}, err
		}
		id, err := idem.External(s, "processor", func(ctx context.Context, key string) (string, error) {
			if inCall != nil {
				inCall(ctx)
			}
			return proc.charge(key), ctx.Err()
		})
		if err != nil {
			return receipt{}, err
		}
		return receipt{Charge: ch, Payment: id}, nil
	}, &idem.OperationConfig[payment, receipt]{Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// TestOperationSteps runs an operation through every node, on a tenant
// whose shards live on the first worker: it begins, runs a database step
// and an external one, stores its answer, and replays it; each of its
// transactions is a single-shard one by Citus's log.
func TestOperationSteps(t *testing.T) {
	c := newCluster(t)
	scope := c.tenantOn(1)
	c.open(scope, 1000)
	ctx := idem.ContextWithScope(context.Background(), scope)
	for _, n := range c.nodes {
		t.Run(n.name, func(t *testing.T) {
			proc := newProcessor()
			op := payOperation(t, n, scope, proc, 0, nil)
			key := "pay-" + n.name
			n.log.record()
			first, outcome, err := op.Run(ctx, key, payment{Amount: 10})
			cmds := n.log.take()
			if err != nil || outcome != idem.OutcomeExecuted {
				t.Fatalf("run: %v, %v", outcome, err)
			}
			singleShard(t, n, cmds)
			again, outcome, err := op.Run(ctx, key, payment{Amount: 10})
			if err != nil || outcome != idem.OutcomeReplayed || again != first {
				t.Fatalf("replay: %+v, %v, %v; first %+v", again, outcome, err, first)
			}
			if _, outcome, err := op.Run(ctx, key, payment{Amount: 11}); !errors.Is(err, idem.ErrMismatch) || outcome != idem.OutcomeMismatch {
				t.Fatalf("another request under the key: %v, %v", outcome, err)
			}
			if calls, charges := proc.counts(); calls != 1 || charges != 1 {
				t.Fatalf("processor: %d calls, %d charges; want 1 each", calls, charges)
			}
			if got := c.count("SELECT count(*) FROM charges WHERE scope = $1 AND ref = $2", scope, key); got != 1 {
				t.Fatalf("%d reservations, want 1", got)
			}
			if got := c.count("SELECT count(*) FROM idempotency_keys_operations WHERE scope = $1", scope); got != 0 {
				t.Fatalf("%d unfinished operations left", got)
			}
		})
	}
}

// TestOperationTakeoverThroughAnotherNode: an owner entering through the
// worker without the tenant's shard stops renewing inside its external
// step (its lease is ended by hand, as when its process froze); a call
// through the coordinator takes the operation over, finds the database
// step recorded, repeats the external call with the same key and stores
// the answer; the first owner then records nothing. One reservation, one
// charge at the processor.
func TestOperationTakeoverThroughAnotherNode(t *testing.T) {
	c := newCluster(t)
	scope := c.tenantOn(1)
	c.open(scope, 1000)
	ctx := idem.ContextWithScope(context.Background(), scope)
	proc := newProcessor()
	inCall, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	first := payOperation(t, c.nodes[len(c.nodes)-1], scope, proc, time.Second, func(context.Context) {
		once.Do(func() { close(inCall); <-resume })
	})
	second := payOperation(t, c.nodes[0], scope, proc, time.Second, nil)
	const key = "taken-over"

	type result struct {
		outcome idem.Outcome
		err     error
	}
	done := make(chan result, 1)
	go func() {
		_, outcome, err := first.Run(ctx, key, payment{Amount: 10})
		done <- result{outcome, err}
	}()
	<-inCall
	if _, outcome, err := second.Run(ctx, key, payment{Amount: 10}); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("while the owner works: %v, %v; want ErrInProgress", outcome, err)
	}
	if _, err := c.nodes[0].pool.Exec(context.Background(),
		"UPDATE idempotency_keys_operations SET lease_until = now() - interval '1 second' WHERE scope = $1 AND idempotency_key = $2",
		scope, key); err != nil {
		t.Fatal(err)
	}
	c.nodes[0].log.record()
	got, outcome, err := second.Run(ctx, key, payment{Amount: 10})
	cmds := c.nodes[0].log.take()
	if err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("takeover: %v, %v", outcome, err)
	}
	singleShard(t, c.nodes[0], cmds)
	close(resume)
	r := <-done
	if !errors.Is(r.err, idem.ErrLeaseLost) || r.outcome != idem.OutcomeFailed {
		t.Fatalf("the first owner after the takeover: %v, %v; want ErrLeaseLost", r.outcome, r.err)
	}
	if calls, charges := proc.counts(); calls != 2 || charges != 1 {
		t.Fatalf("processor: %d calls, %d charges; want 2 calls with one key, 1 charge", calls, charges)
	}
	if got := c.count("SELECT count(*) FROM charges WHERE scope = $1 AND ref = $2", scope, key); got != 1 {
		t.Fatalf("%d reservations, want 1", got)
	}
	for _, n := range c.nodes {
		again, outcome, err := payOperation(t, n, scope, proc, 0, nil).Run(ctx, key, payment{Amount: 10})
		if err != nil || outcome != idem.OutcomeReplayed || again != got {
			t.Fatalf("replay through %s: %+v, %v, %v; want %+v", n.name, again, outcome, err, got)
		}
	}
}

// TestOperationRenewals keeps two owners, of tenants on different workers,
// inside external steps for several lease lengths through the
// coordinator: the renewer's one pipeline per round renews each lease on
// its own shard, each statement a transaction of its own (no two-phase
// commit), and both owners finish.
func TestOperationRenewals(t *testing.T) {
	c := newCluster(t)
	n := c.nodes[0]
	scopes := []string{c.tenantOn(1), c.tenantOn(len(c.nodes) - 1)}
	proc := newProcessor()
	client, err := idem.NewClient(n.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	const lease = 300 * time.Millisecond
	op, err := idem.NewOperation(client, "wait", func(s *idem.Steps, p payment) (string, error) {
		return idem.External(s, "processor", func(ctx context.Context, key string) (string, error) {
			select {
			case <-time.After(4 * lease):
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
			return proc.charge(key), nil
		})
	}, &idem.OperationConfig[payment, string]{Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	n.log.record()
	var wg sync.WaitGroup
	errs := make([]error, len(scopes))
	for i, scope := range scopes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := idem.ContextWithScope(context.Background(), scope)
			_, outcome, err := op.Run(ctx, "renewed", payment{Amount: 1})
			if err == nil && outcome != idem.OutcomeExecuted {
				err = fmt.Errorf("outcome %v", outcome)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	cmds := n.log.take()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("owner of %s: %v", scopes[i], err)
		}
	}
	renewedOn := map[string]int{}
	for _, cmd := range cmds {
		if strings.HasPrefix(cmd.command, "PREPARE TRANSACTION") {
			t.Fatalf("a two-phase commit: %s on %s", cmd.command, cmd.server)
		}
		if strings.Contains(cmd.command, "held AS") {
			renewedOn[cmd.server]++
		}
	}
	if len(renewedOn) != 2 {
		t.Fatalf("renewals reached %v; want both workers", renewedOn)
	}
	t.Logf("renewals per worker: %v", renewedOn)
}
