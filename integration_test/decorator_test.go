package integration_test

import (
	"context"
	"errors"
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

	first, err := charge(ctx, "key-1", chargeRequest{AccountID: 1, Amount: 300})
	if err != nil {
		t.Fatal(err)
	}
	again, err := charge(ctx, "key-1", chargeRequest{AccountID: 1, Amount: 300})
	if err != nil || again != first {
		t.Fatalf("replay = %+v, %v; want %+v", again, err, first)
	}
	if _, err := charge(ctx, "key-1", chargeRequest{AccountID: 1, Amount: 301}); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("changed request: %v, want ErrMismatch", err)
	}
	// The same key for another operation, in a tenant's scope, is another
	// key.
	o, err := createOrder(idem.ContextWithScope(ctx, "tenant-7"), "key-1", orderRequest{AccountID: 2, Items: []string{"a", "b"}})
	if err != nil || o.Items != 2 {
		t.Fatalf("order = %+v, %v", o, err)
	}
	// A refusal is stored under the operation's scope and replayed.
	for i := 0; i < 2; i++ {
		if _, err := charge(ctx, "key-2", chargeRequest{AccountID: 1, Amount: 1 << 40}); !errors.Is(err, errInsufficientFunds) {
			t.Fatalf("refusal %d: %v", i, err)
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
		f    func(context.Context, string, chargeRequest) (charge, error)
		want error
	}{
		"invalid option": {idem.Wrap(countingBeginner{t}, "op", shop{}.Charge, idem.WithWait(-time.Second)), idem.ErrInvalidOption},
		"no operation":   {idem.Wrap(countingBeginner{t}, "", shop{}.Charge), idem.ErrInvalidOption},
		"nil database":   {idem.Wrap[chargeRequest, charge](nil, "op", shop{}.Charge), idem.ErrInvalidOption},
		"nil method":     {idem.Wrap[chargeRequest, charge](countingBeginner{t}, "op", nil), idem.ErrInvalidOption},
	} {
		if _, err := c.f(ctx, "k", chargeRequest{AccountID: 1, Amount: 1}); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}
