package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// Contracts of idem.Operation that the rest of the suite did not hold:
// each test below passes on a correct Operation and fails with one small
// bug of scripts/mutations/mutations.txt (issue 32).

// OperationConfig.Deadline counts from the operation's beginning in the
// unit it is given: an operation with a one-minute deadline, retried a
// moment after its first step failed, resumes and finishes; it is
// compensated only once the deadline has truly passed. A deadline read in the wrong
// unit (milliseconds for microseconds: 1000 times too short) would
// compensate the first.
func TestOperationDeadlineCountsInItsUnit(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx := context.Background()
	var compensated atomic.Int32
	deadlined := func(deadline time.Duration) (*idem.Operation[chargeReq, chargeResp], func()) {
		var lost atomic.Bool
		lost.Store(true)
		op, err := idem.NewOperation(s.client, "charge", s.chargeSteps(map[string]func(context.Context) error{
			"charge": func(context.Context) error {
				if lost.Load() {
					return errors.New("the processor's answer was lost")
				}
				return nil
			},
		}), &idem.OperationConfig[chargeReq, chargeResp]{
			Deadline: deadline,
			Compensate: func(_ *idem.Steps, _ chargeReq, cause error) (chargeResp, error) {
				compensated.Add(1)
				if !errors.Is(cause, idem.ErrDeadline) {
					t.Errorf("Compensate's cause %v; want ErrDeadline", cause)
				}
				return chargeResp{}, idem.Refuse("expired", cause.Error())
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return op, func() { lost.Store(false) }
	}

	t.Run("within", func(t *testing.T) {
		op, answer := deadlined(time.Minute)
		if _, outcome, err := op.Run(ctx, "k-within", chargeReq{Amount: 100}); outcome != idem.OutcomeFailed || err == nil {
			t.Fatalf("first Run: %v, %v; want failed after its first step", outcome, err)
		}
		answer()
		// Far less than the minute: a deadline 1000 times too short (60 ms)
		// has passed by now.
		time.Sleep(300 * time.Millisecond)
		resp, outcome, err := op.Run(ctx, "k-within", chargeReq{Amount: 100})
		if err != nil || outcome != idem.OutcomeExecuted || resp.ChargeID == "" {
			t.Fatalf("retry within the deadline: %+v, %v, %v; want the operation resumed and executed", resp, outcome, err)
		}
		if n := compensated.Load(); n != 0 {
			t.Fatalf("Compensate ran %d times within a one-minute deadline", n)
		}
		if res, rec := s.rowsOf("k-within"); res != 1 || rec != 1 {
			t.Fatalf("reservations %d, receipts %d; want 1 each", res, rec)
		}
	})

	t.Run("past", func(t *testing.T) {
		compensated.Store(0)
		op, answer := deadlined(100 * time.Millisecond)
		if _, outcome, err := op.Run(ctx, "k-past", chargeReq{Amount: 200}); outcome != idem.OutcomeFailed || err == nil {
			t.Fatalf("first Run: %v, %v; want failed after its first step", outcome, err)
		}
		answer()
		// The database's clock decides, as operation_take.sql does.
		for s.count("SELECT count(*) FROM idempotency_keys_operations WHERE idempotency_key = 'k-past' AND deadline_at <= now()") == 0 {
			time.Sleep(20 * time.Millisecond)
		}
		_, outcome, err := op.Run(ctx, "k-past", chargeReq{Amount: 200})
		var r *idem.Refusal
		if outcome != idem.OutcomeRefused || !errors.As(err, &r) || r.Code != "expired" {
			t.Fatalf("retry past the deadline: %v, %v; want Compensate's refusal", outcome, err)
		}
		if n := compensated.Load(); n != 1 {
			t.Fatalf("Compensate ran %d times past the deadline; want 1", n)
		}
		if res, rec := s.rowsOf("k-past"); res != 1 || rec != 0 {
			t.Fatalf("reservations %d, receipts %d; want the first step's reservation only", res, rec)
		}
	})
}

// A step's context ends with ErrLeaseLost once a renewal finds the lease
// gone, while the step still runs: an external call that waits on its
// context stops, and Run reports ErrLeaseLost, not the call's own error.
// The test takes the lease away in the database, as another owner's
// takeover would (a new token).
func TestOperationLostLeaseEndsTheStep(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errAbandoned := errors.New("the processor call was abandoned")
	at := make(chan struct{})
	ended := make(chan error, 1) // the cause the call's context ended with
	var once sync.Once
	s.proc.before = func(cctx context.Context, _ string) error {
		once.Do(func() { close(at) })
		// Bounded so that a context that never ends fails the test, not
		// the run; the bound decides nothing when the renewal works.
		bound := time.NewTimer(30 * time.Second)
		defer bound.Stop()
		select {
		case <-cctx.Done():
			ended <- context.Cause(cctx)
		case <-bound.C:
			ended <- nil
		}
		return errAbandoned
	}
	op := s.operation(nil, &idem.OperationConfig[chargeReq, chargeResp]{Lease: 300 * time.Millisecond})
	done := make(chan runResult, 1)
	go func() { done <- runOp(ctx, op, "k", chargeReq{Amount: 400}) }()
	select {
	case <-at:
	case res := <-done:
		t.Fatalf("the owner ended (%v, %v) before its external call", res.outcome, res.err)
	}
	s.exec("UPDATE idempotency_keys_operations SET token = token + 1000000 WHERE idempotency_key = 'k'")

	cause := <-ended
	res := <-done
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("the external call's context: cause %v; want it ended with ErrLeaseLost (nil: not ended within 30 s)", cause)
	}
	if res.outcome != idem.OutcomeFailed || !errors.Is(res.err, idem.ErrLeaseLost) {
		t.Fatalf("Run: %v, %v; want failed with ErrLeaseLost", res.outcome, res.err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys_steps WHERE step = 'charge'"); n != 0 {
		t.Fatalf("%d records of the charge step; want none", n)
	}
	if _, rec := s.rowsOf("k"); rec != 0 {
		t.Fatalf("%d receipts; want none", rec)
	}
}

// The operation's name enters its request hash: one key used by two
// operations with the same request is ErrMismatch for the second, which
// runs nothing, whether the first finished or is unfinished (and so is
// another request of the same operation while it is unfinished).
func TestOperationNameInTheRequestHash(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx := context.Background()
	var refunds atomic.Int32
	refund, err := idem.NewOperation(s.client, "refund", func(*idem.Steps, chargeReq) (chargeResp, error) {
		refunds.Add(1)
		return chargeResp{ChargeID: "re_1"}, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := chargeReq{Amount: 500}

	t.Run("finished", func(t *testing.T) {
		first, outcome, err := s.operation(nil, nil).Run(ctx, "k-finished", req)
		if err != nil || outcome != idem.OutcomeExecuted {
			t.Fatalf("charge: %v, %v", outcome, err)
		}
		got, outcome, err := refund.Run(ctx, "k-finished", req)
		if outcome != idem.OutcomeMismatch || !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("refund under the charge's key: %+v, %v, %v; want ErrMismatch (the charge's answer is %+v)", got, outcome, err, first)
		}
	})

	t.Run("unfinished", func(t *testing.T) {
		charge, _ := s.stoppedAtCharge("k-unfinished", 500)
		// Another request of the same operation is refused the same way, at
		// any point of the operation.
		if _, outcome, err := charge.Run(ctx, "k-unfinished", chargeReq{Amount: 501}); outcome != idem.OutcomeMismatch || !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("charge of another amount under an unfinished charge's key: %v, %v; want ErrMismatch", outcome, err)
		}
		got, outcome, err := refund.Run(ctx, "k-unfinished", req)
		if outcome != idem.OutcomeMismatch || !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("refund under an unfinished charge's key: %+v, %v, %v; want ErrMismatch", got, outcome, err)
		}
		if outcome, err := refund.Resume(ctx, "", "k-unfinished"); outcome != idem.OutcomeMismatch || !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("refund's Resume of an unfinished charge: %v, %v; want ErrMismatch", outcome, err)
		}
		if rec, err := s.client.Lookup(ctx, "", "k-unfinished"); err != nil || rec.Status != idem.StatusUnfinished {
			t.Fatalf("Lookup after the refund's calls: %+v, %v; want the charge unfinished", rec, err)
		}
	})

	if n := refunds.Load(); n != 0 {
		t.Fatalf("the refund's function ran %d times under the charge's keys", n)
	}
}

// NewOperation refuses, with ErrInvalidOption, what its godoc and
// OperationConfig's fields refuse: found at construction, not at the first
// call.
func TestNewOperationRefusesBadArguments(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx := context.Background()
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	base, err := idem.NewClient(s.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	onConn := base.On(pc.Conn())
	fn := s.chargeSteps(nil)
	compensate := func(*idem.Steps, chargeReq, error) (chargeResp, error) { return chargeResp{}, nil }
	type cfg = idem.OperationConfig[chargeReq, chargeResp]
	for name, c := range map[string]struct {
		client *idem.Client
		name   string
		fn     func(*idem.Steps, chargeReq) (chargeResp, error)
		cfg    *cfg
	}{
		"nil client":                  {nil, "charge", fn, nil},
		"client on a connection":      {onConn, "charge", fn, nil},
		"empty name":                  {s.client, "", fn, nil},
		"name with a control byte":    {s.client, "char\x00ge", fn, nil},
		"nil function":                {s.client, "charge", nil, nil},
		"lease under 100ms":           {s.client, "charge", fn, &cfg{Lease: 50 * time.Millisecond}},
		"negative lease":              {s.client, "charge", fn, &cfg{Lease: -time.Second}},
		"negative deadline":           {s.client, "charge", fn, &cfg{Deadline: -time.Second, Compensate: compensate}},
		"deadline without compensate": {s.client, "charge", fn, &cfg{Deadline: time.Minute}},
		"compensate without deadline": {s.client, "charge", fn, &cfg{Compensate: compensate}},
	} {
		t.Run(name, func(t *testing.T) {
			if op, err := idem.NewOperation(c.client, c.name, c.fn, c.cfg); op != nil || !errors.Is(err, idem.ErrInvalidOption) {
				t.Fatalf("NewOperation: %v, %v; want ErrInvalidOption", op, err)
			}
		})
	}
	if _, err := idem.NewOperation(s.client, "chan", func(*idem.Steps, chan int) (chargeResp, error) { return chargeResp{}, nil }, nil); err == nil {
		t.Fatal("NewOperation with a request that does not encode to JSON: no error")
	}
}

// An operation refuses the partitioned key table (a partition is dropped
// whole once its keys expire, and an unfinished key must outlive that)
// with ErrInvalidOption, before anything runs or is stored.
func TestOperationRefusesThePartitionedLayout(t *testing.T) {
	t.Parallel()
	base := newSetupLayout(t, partitioned)
	if _, err := base.pool.Exec(context.Background(), opSQL); err != nil {
		t.Fatal(err)
	}
	client, err := idem.NewClient(base.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &opSetup{setup: base, proc: newProcessor(), client: client}
	_, outcome, err := s.operation(nil, nil).Run(context.Background(), "k", chargeReq{Amount: 1})
	if outcome != idem.OutcomeFailed || !errors.Is(err, idem.ErrInvalidOption) {
		t.Fatalf("Run on the partitioned layout: %v, %v; want ErrInvalidOption", outcome, err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d keys stored", n)
	}
	if res, _ := s.rowsOf("k"); res != 0 || s.proc.callCount() != 0 {
		t.Fatalf("reservations %d, processor calls %d; want nothing run", res, s.proc.callCount())
	}
}

// A key that Do used is ErrMismatch for an operation (its request hash
// has the operation's name in it), and the operation runs nothing.
func TestOperationOnAKeyOfDo(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx := context.Background()
	if _, err := idem.Do(ctx, s.client, "k", "h", func(pgx.Tx) (chargeResp, error) { return chargeResp{ChargeID: "do"}, nil }); err != nil {
		t.Fatal(err)
	}
	op := s.operation(nil, nil)
	if _, outcome, err := op.Run(ctx, "k", chargeReq{Amount: 1}); outcome != idem.OutcomeMismatch || !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("Run on Do's key: %v, %v; want ErrMismatch", outcome, err)
	}
	if res, _ := s.rowsOf("k"); res != 0 || s.proc.callCount() != 0 {
		t.Fatalf("reservations %d, processor calls %d; want nothing run", res, s.proc.callCount())
	}
}

// Misuses of a step inside the operation's function fail that step with
// the error its godoc names, and the operation stays unfinished: a step
// name used twice or a nil function (ErrInvalidOption), and a step's
// function that ends the step's transaction itself (ErrTxEnded).
func TestOperationStepMisuse(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx := context.Background()
	for name, c := range map[string]struct {
		fn   func(st *idem.Steps, req chargeReq) (chargeResp, error)
		want error
	}{
		"name twice": {func(st *idem.Steps, _ chargeReq) (chargeResp, error) {
			for range 2 {
				if _, err := idem.Step(st, "reserve", func(context.Context, pgx.Tx) (int, error) { return 1, nil }); err != nil {
					return chargeResp{}, err
				}
			}
			return chargeResp{}, nil
		}, idem.ErrInvalidOption},
		"external name of a step": {func(st *idem.Steps, _ chargeReq) (chargeResp, error) {
			if _, err := idem.Step(st, "reserve", func(context.Context, pgx.Tx) (int, error) { return 1, nil }); err != nil {
				return chargeResp{}, err
			}
			_, err := idem.External(st, "reserve", func(context.Context, string) (int, error) { return 1, nil })
			return chargeResp{}, err
		}, idem.ErrInvalidOption},
		"nil step function": {func(st *idem.Steps, _ chargeReq) (chargeResp, error) {
			_, err := idem.Step[int](st, "reserve", nil)
			return chargeResp{}, err
		}, idem.ErrInvalidOption},
		"nil external function": {func(st *idem.Steps, _ chargeReq) (chargeResp, error) {
			_, err := idem.External[int](st, "charge", nil)
			return chargeResp{}, err
		}, idem.ErrInvalidOption},
		"step ends its transaction": {func(st *idem.Steps, _ chargeReq) (chargeResp, error) {
			_, err := idem.Step(st, "reserve", func(ctx context.Context, tx pgx.Tx) (int, error) {
				_, err := tx.Exec(ctx, "rollback")
				return 1, err
			})
			return chargeResp{}, err
		}, idem.ErrTxEnded},
	} {
		t.Run(name, func(t *testing.T) {
			op, err := idem.NewOperation(s.client, "misuse", c.fn, nil)
			if err != nil {
				t.Fatal(err)
			}
			key := "k-" + name
			if _, outcome, err := op.Run(ctx, key, chargeReq{Amount: 1}); outcome != idem.OutcomeFailed || !errors.Is(err, c.want) {
				t.Fatalf("Run: %v, %v; want failed with %v", outcome, err, c.want)
			}
			if rec, err := s.client.Lookup(ctx, "", key); err != nil || rec.Status != idem.StatusUnfinished {
				t.Fatalf("Lookup: %+v, %v; want the operation unfinished", rec, err)
			}
		})
	}
}

// With a Sealer, an operation stores its request and every step's output
// sealed, as Do stores its result, and opens them to resume: the completer
// (Resume) finishes it from the sealed request.
func TestOperationSealsItsRequestAndSteps(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, &idem.Config{Sealer: xorSealer{}})
	ctx := context.Background()
	const amount = 424242
	op, answer := s.stoppedAtCharge("k", amount)
	for what, q := range map[string]string{
		"the request":          "SELECT count(*) FROM idempotency_keys_operations WHERE position('424242' in encode(request, 'escape')) > 0",
		"the reserve's output": "SELECT count(*) FROM idempotency_keys_steps WHERE position('424242' in encode(output, 'escape')) > 0",
	} {
		if n := s.count(q); n != 0 {
			t.Fatalf("%s was stored in plain", what)
		}
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys_steps"); n != 1 {
		t.Fatalf("%d step records; want the reservation's", n)
	}
	answer()
	if outcome, err := op.Resume(ctx, "", "k"); err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("Resume from the sealed request: %v, %v", outcome, err)
	}
	resp, outcome, err := op.Run(ctx, "k", chargeReq{Amount: amount})
	if err != nil || outcome != idem.OutcomeReplayed || resp.Amount != amount {
		t.Fatalf("replay: %+v, %v, %v", resp, outcome, err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys WHERE position('424242' in encode(response, 'escape')) > 0"); n != 0 {
		t.Fatal("the answer was stored in plain")
	}
}

// An error from OperationConfig.OnStart rolls back the transaction that
// begins the operation, with OnStart's own writes, and fails the call:
// the key holds nothing and no step ran. Without an error, OnStart's
// writes commit with the beginning.
func TestOperationOnStartCommitsWithTheBeginning(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx := context.Background()
	errRefused := errors.New("the job queue refused")
	var fail atomic.Bool
	fail.Store(true)
	op := s.operation(nil, &idem.OperationConfig[chargeReq, chargeResp]{
		OnStart: func(ctx context.Context, tx pgx.Tx, ref idem.OperationRef) error {
			if ref.Operation != "charge" || ref.Key != "k" {
				return fmt.Errorf("OnStart's ref %+v", ref)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO op_receipts VALUES ('onstart', $1)", ref.Key); err != nil {
				return err
			}
			if fail.Load() {
				return errRefused
			}
			return nil
		},
	})
	if _, outcome, err := op.Run(ctx, "k", chargeReq{Amount: 1}); outcome != idem.OutcomeFailed || !errors.Is(err, errRefused) {
		t.Fatalf("Run with OnStart failing: %v, %v; want failed with OnStart's error", outcome, err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys") + s.count("SELECT count(*) FROM idempotency_keys_operations") +
		s.count("SELECT count(*) FROM op_receipts") + s.count("SELECT count(*) FROM op_reservations"); n != 0 || s.proc.callCount() != 0 {
		t.Fatalf("%d rows, %d processor calls after OnStart failed; want none", n, s.proc.callCount())
	}
	fail.Store(false)
	if _, outcome, err := op.Run(ctx, "k", chargeReq{Amount: 1}); err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("Run: %v, %v", outcome, err)
	}
	if n := s.count("SELECT count(*) FROM op_receipts WHERE key = 'onstart'"); n != 1 {
		t.Fatalf("%d rows of OnStart; want 1, committed with the beginning", n)
	}
}

// An external step runs with no transaction open and no connection held:
// on a pool of two connections, five operations wait at the processor at
// once. Each step's context carries the operation's key: KeyFromContext
// and DeriveKey give what Steps.Key does, and the key External passes is
// Key().Derive of the step's name.
func TestOperationHoldsNoConnectionDuringAnExternalStep(t *testing.T) {
	t.Parallel()
	base := newSetup(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	if _, err := base.pool.Exec(context.Background(), opSQL); err != nil {
		t.Fatal(err)
	}
	client, err := idem.NewClient(base.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &opSetup{setup: base, proc: newProcessor(), client: client}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const owners = 5
	arrived, release := make(chan struct{}, owners), make(chan struct{})
	s.proc.before = func(cctx context.Context, _ string) error {
		arrived <- struct{}{}
		select {
		case <-release:
			return nil
		case <-cctx.Done():
			return cctx.Err()
		}
	}
	op, err := idem.NewOperation(s.client, "charge", func(st *idem.Steps, req chargeReq) (chargeResp, error) {
		if k, ok := idem.KeyFromContext(st.Context()); !ok || k != st.Key() {
			return chargeResp{}, fmt.Errorf("KeyFromContext of the run's context: %+v, %v; Steps.Key %+v", k, ok, st.Key())
		}
		return s.chargeSteps(nil)(st, req)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var keys sync.Map // operation key -> the key its charge was sent with
	s.proc.after = func(cctx context.Context, pkey string) error {
		k, _ := idem.KeyFromContext(cctx)
		derived, err := idem.DeriveKey(cctx, "charge")
		if err != nil || derived != pkey || k.Derive("charge") != pkey {
			return fmt.Errorf("External's key %s, DeriveKey %s (%w)", pkey, derived, err)
		}
		keys.Store(k.Key, pkey)
		return nil
	}
	done := make(chan runResult, owners)
	for i := range owners {
		go func() { done <- runOp(ctx, op, fmt.Sprintf("k-%d", i), chargeReq{Amount: int64(100 + i)}) }()
	}
	at := 0
	for wait := time.After(30 * time.Second); at < owners; at++ {
		select {
		case <-arrived:
			continue
		case <-wait:
		}
		break
	}
	close(release)
	for range owners {
		if res := <-done; res.err != nil || res.outcome != idem.OutcomeExecuted {
			t.Errorf("an owner: %v, %v", res.outcome, res.err)
		}
	}
	if at != owners {
		t.Fatalf("%d of %d owners at the processor at once on a pool of 2: an external step holds a connection", at, owners)
	}
	n := 0
	keys.Range(func(any, any) bool { n++; return true })
	if n != owners {
		t.Fatalf("%d operations checked their derived key; want %d", n, owners)
	}
}

// A lost reply to the statement that stores the answer is OutcomeUnknown
// (ErrOutcomeUnknown), and a retry with the same key replays the answer or
// finishes the operation: one charge, each step's rows once.
func TestOperationAnswerLostIsUnknown(t *testing.T) {
	t.Parallel()
	r := newOpRig(t, sweepLease)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key, amount = "k-unknown", 900
	req := chargeReq{Amount: amount}
	stored := func(m faultproxy.Message) bool {
		return !m.FromClient && m.Type == 'C' && strings.Contains(m.SQL, "operation_complete:")
	}
	r.proxy.SetRule(faultproxy.Once(stored, faultproxy.CutBefore))
	op := r.op(r.ownerPool(), nil, noHooks)
	_, outcome, err := op.Run(ctx, key, req)
	r.proxy.SetRule(nil)
	if outcome != idem.OutcomeUnknown || !errors.Is(err, idem.ErrOutcomeUnknown) {
		t.Fatalf("Run whose answer's reply was lost: %v, %v; want ErrOutcomeUnknown", outcome, err)
	}
	for {
		resp, outcome, err := op.Run(ctx, key, req)
		if errors.Is(err, idem.ErrInProgress) && ctx.Err() == nil {
			time.Sleep(r.lease / 4) // not stored: held until the lease ends
			continue
		}
		if err != nil || outcome != idem.OutcomeReplayed && outcome != idem.OutcomeExecuted {
			t.Fatalf("the retry: %v, %v; want the answer replayed or the operation finished", outcome, err)
		}
		r.settledOnce(key, amount, 1, 2, resp)
		return
	}
}

// An owner at work renews its lease: held in its external call past the
// lease it took, it still holds a running lease (a duplicate would get
// ErrInProgress), and it finishes the operation once the call returns.
func TestOperationRenewalKeepsAWorkingOwner(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	at, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.proc.before = func(cctx context.Context, _ string) error {
		once.Do(func() { close(at) })
		select {
		case <-release:
			return nil
		case <-cctx.Done():
			return context.Cause(cctx)
		}
	}
	// Three seconds, so that a loaded machine does not delay a renewal
	// past the lease of this live owner.
	op := s.operation(nil, &idem.OperationConfig[chargeReq, chargeResp]{Lease: 3 * time.Second})
	done := make(chan runResult, 1)
	go func() { done <- runOp(ctx, op, "k", chargeReq{Amount: 600}) }()
	select {
	case <-at:
	case res := <-done:
		t.Fatalf("the owner ended (%v, %v) before its external call", res.outcome, res.err)
	}
	var first time.Time
	if err := s.pool.QueryRow(ctx, "SELECT lease_until FROM idempotency_keys_operations WHERE idempotency_key = 'k'").Scan(&first); err != nil {
		t.Fatal(err)
	}
	// The database's clock decides: the lease first taken has ended, and
	// a renewal has moved it on.
	renewed := false
	for bound := time.Now().Add(30 * time.Second); !renewed && time.Now().Before(bound); time.Sleep(20 * time.Millisecond) {
		if err := s.pool.QueryRow(ctx, `SELECT now() > $1 AND lease_until > now()
			FROM idempotency_keys_operations WHERE idempotency_key = 'k'`, first).Scan(&renewed); err != nil {
			close(release)
			<-done
			t.Fatal(err)
		}
	}
	close(release)
	res := <-done
	if !renewed {
		t.Fatal("the working owner's lease was not renewed past the one it took within 30 s")
	}
	if res.err != nil || res.outcome != idem.OutcomeExecuted {
		t.Fatalf("the owner held past its first lease: %v, %v; want executed", res.outcome, res.err)
	}
}
