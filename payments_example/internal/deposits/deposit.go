package deposits

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/payments_example/internal/payments"
)

//go:embed sql/credit.sql
var creditSQL string

// A Deposit is the body of a deposit event: money received for an
// account, in minor units (cents).
type Deposit struct {
	AccountID uuid.UUID `json:"account_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
}

// ErrInvalid means the event can never be credited: it has no id, its
// body is not a Deposit, or its account does not exist. Retrying does not
// help; the wrapping error says what is wrong.
var ErrInvalid = errors.New("deposits: invalid deposit event")

// RefusalCode is the code of the refusal Handler stores for an event that
// wraps ErrInvalid.
const RefusalCode = "invalid_deposit"

// credit credits the deposit in body, the event eventID, to its account
// and records it in the ledger, both in tx. It returns an error wrapping
// ErrInvalid, and writes nothing, for an event that can never be credited.
func credit(ctx context.Context, tx pgx.Tx, eventID string, body []byte) error {
	if eventID == "" {
		return fmt.Errorf("%w: no producer's id (Nats-Msg-Id)", ErrInvalid)
	}
	var d Deposit
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return fmt.Errorf("%w: the body is not a deposit: %w", ErrInvalid, err)
	}
	switch {
	case d.AccountID == uuid.Nil:
		return fmt.Errorf("%w: no account_id", ErrInvalid)
	case d.Amount <= 0:
		return fmt.Errorf("%w: amount must be a positive integer in minor units", ErrInvalid)
	case d.Currency != payments.Currency:
		return fmt.Errorf("%w: currency must be %s", ErrInvalid, payments.Currency)
	}
	var id int64
	err := tx.QueryRow(ctx, creditSQL, eventID, d.AccountID, d.Amount, d.Currency).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: no account %s", ErrInvalid, d.AccountID)
	}
	if err != nil {
		return fmt.Errorf("deposits: credit: %w", err)
	}
	return nil
}

// Handler credits the deposit of m in tx, the transaction in which m's key
// commits (idemconsume.Handler). An event that can never be credited is
// refused with RefusalCode: the refusal commits with the key, and the
// message is acknowledged, never retried.
func Handler(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
	err := credit(ctx, tx, m.ID, m.Payload)
	if errors.Is(err, ErrInvalid) {
		return idem.Refuse(RefusalCode, err.Error())
	}
	return err
}
