package settlement

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

//go:embed sql/record.sql
var recordSQL string

var (
	// errNoPayment: the payment to record a charge for does not exist.
	errNoPayment = errors.New("settlement: no such payment")
	// errOtherCharge: the payment is already settled by another charge.
	// The processor answered two charges for one key, or one payment was
	// charged under two keys: either breaks the guarantee, and nothing is
	// overwritten.
	errOtherCharge = errors.New("settlement: the payment is already settled by another charge")
)

// record records charge id of the processor as payment's settlement, in
// tx. Recording the same charge again is a no-op that succeeds.
func record(ctx context.Context, tx pgx.Tx, payment uuid.UUID, id string) error {
	var recorded string
	err := tx.QueryRow(ctx, recordSQL, payment, id).Scan(&recorded)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %s", errNoPayment, payment)
	case err != nil:
		return fmt.Errorf("settlement: record the charge of payment %s: %w", payment, err)
	case recorded != id:
		return fmt.Errorf("%w: payment %s, recorded %s, answered %s", errOtherCharge, payment, recorded, id)
	}
	return nil
}
