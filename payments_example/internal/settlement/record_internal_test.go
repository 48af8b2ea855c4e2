package settlement

import (
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/testkit/testdb"
)

// TestRecordIsIdempotent: recording the charge a payment is settled by
// again succeeds and changes nothing (a second run of its job); another
// charge is refused and the first stays (the processor broke its word);
// a payment that does not exist is refused.
func TestRecordIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	if err := payments.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	account, payment := uuid.New(), uuid.New()
	_, err := pool.Exec(ctx, `with a as (insert into accounts (id, owner, balance, api_key_sha256) values ($1, 'ada', 0, sha256('k')) returning id)
		insert into payments (id, account_id, amount, currency) select $2, id, 1, 'USD' from a`, account, payment)
	if err != nil {
		t.Fatal(err)
	}
	in := func(f func(tx pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, f) }
	settledAt := func() (id string, at string) {
		t.Helper()
		if err := pool.QueryRow(ctx, "select processor_id, settled_at::text from payments where id = $1", payment).Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		return id, at
	}

	if err := in(func(tx pgx.Tx) error { return record(ctx, tx, payment, "ch_1") }); err != nil {
		t.Fatal(err)
	}
	id, at := settledAt()
	if err := in(func(tx pgx.Tx) error { return record(ctx, tx, payment, "ch_1") }); err != nil {
		t.Fatalf("the same charge again: %v", err)
	}
	if id2, at2 := settledAt(); id2 != id || at2 != at || id != "ch_1" {
		t.Fatalf("after recording again: %s at %s, was %s at %s", id2, at2, id, at)
	}
	if err := in(func(tx pgx.Tx) error { return record(ctx, tx, payment, "ch_2") }); !errors.Is(err, errOtherCharge) {
		t.Fatalf("another charge: %v, want errOtherCharge", err)
	}
	if id2, _ := settledAt(); id2 != "ch_1" {
		t.Fatalf("another charge overwrote the first: %s", id2)
	}
	if err := in(func(tx pgx.Tx) error { return record(ctx, tx, uuid.New(), "ch_3") }); !errors.Is(err, errNoPayment) {
		t.Fatalf("a missing payment: %v, want errNoPayment", err)
	}
}
