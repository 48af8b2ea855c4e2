package integration_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// shop is a service whose methods know nothing of idempotency; Wrap adds it.
type shop struct{}

type chargeRequest struct {
	AccountID int64 `json:"account_id"`
	Amount    int64 `json:"amount"`
}

type orderRequest struct {
	AccountID int64    `json:"account_id"`
	Items     []string `json:"items"`
}

type order struct {
	ID    int64 `json:"id"`
	Items int   `json:"items"`
}

func (shop) Charge(ctx context.Context, tx pgx.Tx, req chargeRequest) (charge, error) {
	c := charge{Amount: req.Amount}
	err := tx.QueryRow(ctx, "UPDATE accounts SET balance = balance - $1 WHERE id = $2 AND balance >= $1 RETURNING balance", req.Amount, req.AccountID).Scan(&c.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, errInsufficientFunds
	}
	if err != nil {
		return c, err
	}
	err = tx.QueryRow(ctx, "INSERT INTO charges (account_id, amount) VALUES ($1, $2) RETURNING id", req.AccountID, req.Amount).Scan(&c.ID)
	return c, err
}

func (shop) CreateOrder(ctx context.Context, tx pgx.Tx, req orderRequest) (order, error) {
	o := order{Items: len(req.Items)}
	err := tx.QueryRow(ctx, "INSERT INTO charges (account_id, amount) VALUES ($1, 0) RETURNING id", req.AccountID).Scan(&o.ID)
	return o, err
}

func TestWrapPaymentAndOrder(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	var svc shop
	charge := idem.Wrap(s.pool, "payments.charge", svc.Charge)
	createOrder := idem.Wrap(s.pool, "orders.create", svc.CreateOrder)

	first, _, err := charge(ctx, "key-1", chargeRequest{AccountID: 1, Amount: 300})
	if err != nil {
		t.Fatal(err)
	}
	again, outcome, err := charge(ctx, "key-1", chargeRequest{AccountID: 1, Amount: 300})
	if err != nil || again != first || outcome != idem.OutcomeReplayed {
		t.Fatalf("replay = %+v, %v, %v; want %+v, replayed", again, outcome, err, first)
	}
	if _, _, err := charge(ctx, "key-1", chargeRequest{AccountID: 1, Amount: 301}); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("changed request: %v, want ErrMismatch", err)
	}
	// The same key for another operation, in a tenant's scope, is another
	// key.
	o, outcome, err := createOrder(idem.ContextWithScope(ctx, "tenant-7"), "key-1", orderRequest{AccountID: 2, Items: []string{"a", "b"}})
	if err != nil || o.Items != 2 || outcome != idem.OutcomeExecuted {
		t.Fatalf("order = %+v, %v, %v", o, outcome, err)
	}
	// A refusal is stored under the operation's scope and replayed.
	for i, want := range []idem.Outcome{idem.OutcomeRefused, idem.OutcomeReplayed} {
		if _, outcome, err := charge(ctx, "key-2", chargeRequest{AccountID: 1, Amount: 1 << 40}); !errors.Is(err, errInsufficientFunds) || outcome != want {
			t.Fatalf("refusal %d: %v, %v; want %v", i, outcome, err, want)
		}
	}
	if s.charges() != 2 {
		t.Fatalf("%d charges, want 2 (one payment, one order)", s.charges())
	}
	// Keys are stored under each operation's scope: an unscoped charge and
	// an order in tenant-7.
	scopes := s.count("SELECT count(DISTINCT scope) FROM idempotency_keys WHERE scope IN ($1, $2)",
		"\x1fpayments.charge\x1f", "\x1forders.create\x1ftenant-7")
	if scopes != 2 {
		t.Fatalf("keys are not scoped by operation (%d scopes)", scopes)
	}
}

// Wrap never panics on bad input: every call fails with the error.
func TestWrapRefusesMisuse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, c := range map[string]struct {
		f    func(context.Context, string, chargeRequest) (charge, idem.Outcome, error)
		want error
	}{
		"invalid option": {idem.Wrap(countingBeginner{t}, "op", shop{}.Charge, idem.WithWait(-time.Second)), idem.ErrInvalidOption},
		"no operation":   {idem.Wrap(countingBeginner{t}, "", shop{}.Charge), idem.ErrInvalidOption},
		"nil database":   {idem.Wrap[chargeRequest, charge](nil, "op", shop{}.Charge), idem.ErrInvalidOption},
		"nil method":     {idem.Wrap[chargeRequest, charge](countingBeginner{t}, "op", nil), idem.ErrInvalidOption},
	} {
		if _, outcome, err := c.f(ctx, "k", chargeRequest{AccountID: 1, Amount: 1}); !errors.Is(err, c.want) || outcome != idem.OutcomeInvalid {
			t.Errorf("%s: %v, %v; want invalid, %v", name, outcome, err, c.want)
		}
	}
}

// A wrapped function returns how each call ended, per call: executed, then
// replayed for the retry, then mismatch for the same key with another
// request. Calls running at once on one wrapped function each get their
// own outcome, with nothing shared between them for the race detector to
// find.
func TestWrapReturnsEachCallsOutcome(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	charge := idem.Wrap(s.pool, "payments.charge", shop{}.Charge)

	req := chargeRequest{AccountID: 1, Amount: 300}
	first, outcome, err := charge(ctx, "key-1", req)
	if err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("first call: %v, %v; want executed", outcome, err)
	}
	again, outcome, err := charge(ctx, "key-1", req)
	if err != nil || outcome != idem.OutcomeReplayed || again != first {
		t.Fatalf("retry: %+v, %v, %v; want %+v, replayed", again, outcome, err, first)
	}
	if _, outcome, err := charge(ctx, "key-1", chargeRequest{AccountID: 1, Amount: 301}); !errors.Is(err, idem.ErrMismatch) || outcome != idem.OutcomeMismatch {
		t.Fatalf("changed request: %v, %v; want mismatch, ErrMismatch", outcome, err)
	}

	// 16 keys, a third already used with the same request (a replay), a
	// third with another (a mismatch), a third new; then one goroutine per
	// key, all at once.
	const n = 16
	want := make([]idem.Outcome, n)
	key := func(i int) string { return fmt.Sprintf("concurrent-%d", i) }
	for i := range n {
		switch i % 3 {
		case 0:
			want[i] = idem.OutcomeReplayed
			_, _, err = charge(ctx, key(i), req)
		case 1:
			want[i] = idem.OutcomeMismatch
			_, _, err = charge(ctx, key(i), chargeRequest{AccountID: 2, Amount: 1})
		default:
			want[i] = idem.OutcomeExecuted
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	got := make([]idem.Outcome, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			_, got[i], errs[i] = charge(ctx, key(i), req)
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if got[i] != want[i] {
			t.Errorf("%s: outcome %v (%v), want %v", key(i), got[i], errs[i], want[i])
		}
		if wantErr := want[i] == idem.OutcomeMismatch; wantErr != errors.Is(errs[i], idem.ErrMismatch) || !wantErr && errs[i] != nil {
			t.Errorf("%s: error %v, want ErrMismatch only for a mismatch", key(i), errs[i])
		}
	}
	// One charge for key-1 and one per concurrent key: each ran once, before
	// or during the concurrent calls.
	if got := s.charges(); got != 1+n {
		t.Errorf("%d charges, want %d", got, 1+n)
	}
}
