package integration_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// Two callers that use one key in one scope share one row: the second's fn
// never runs. Replayed into a result type that shares no field with what the
// first stored, the answer is ErrCorruptRecord, never a zero value passed
// off as the second caller's result; a result type that gained or lost a
// field since it stored the result still replays.
func TestSharedKeyIntoAnotherType(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	type charge struct {
		ChargeID string `json:"charge_id"`
		Amount   int    `json:"amount"`
	}
	type shipment struct {
		Carrier  string
		Tracking string
	}
	if _, err := idem.Do(ctx, s.pool, "event-1", "h", func(pgx.Tx) (charge, error) {
		return charge{ChargeID: "ch_1", Amount: 500}, nil
	}); err != nil {
		t.Fatal(err)
	}
	ran := false
	got, outcome, err := idem.Run(ctx, s.pool, "event-1", "h", func(context.Context, pgx.Tx) (shipment, error) {
		ran = true
		return shipment{Carrier: "ups"}, nil
	})
	if ran || !errors.Is(err, idem.ErrCorruptRecord) || got != (shipment{}) {
		t.Fatalf("another type under the same key: fn ran %v, %+v, %v, %v; want ErrCorruptRecord and fn not run", ran, got, outcome, err)
	}

	// The same type, evolved: one field dropped, one added.
	type chargeV2 struct {
		ChargeID string `json:"charge_id"`
		Currency string `json:"currency"`
	}
	v2, err := idem.Do(ctx, s.pool, "event-1", "h", func(pgx.Tx) (chargeV2, error) {
		return chargeV2{}, errors.New("must not run")
	})
	if err != nil || v2.ChargeID != "ch_1" {
		t.Fatalf("an evolved type: %+v, %v; want the stored charge_id replayed", v2, err)
	}

	// A stored result that is all zero values is not another caller's.
	if _, err := idem.Do(ctx, s.pool, "event-2", "h", func(pgx.Tx) (charge, error) { return charge{}, nil }); err != nil {
		t.Fatal(err)
	}
	if zero, err := idem.Do(ctx, s.pool, "event-2", "h", func(pgx.Tx) (charge, error) {
		return charge{}, errors.New("must not run")
	}); err != nil || zero != (charge{}) {
		t.Fatalf("a zero result replayed: %+v, %v", zero, err)
	}
}
