package payments

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/charge.sql
	chargeSQL string
	//go:embed sql/account_exists.sql
	accountExistsSQL string
	//go:embed sql/insert_payment.sql
	insertPaymentSQL string
)

// Currency is the only currency the example accepts.
const Currency = "USD"

// Payment is a committed charge as the API shows it. Balance is the
// account's balance right after the charge.
type Payment struct {
	ID        int64 `json:"id"`
	AccountID int64 `json:"account_id"`
	Amount    int64 `json:"amount"`
	Balance   int64 `json:"balance"`
}

// ErrInsufficientFunds means the balance does not cover the amount; nothing
// was charged.
var ErrInsufficientFunds = errors.New("payments: insufficient funds")

// charge takes amount from the account and records the payment, both in tx.
// It returns ErrNoAccount or ErrInsufficientFunds without charging anything.
func charge(ctx context.Context, tx pgx.Tx, accountID, amount int64, currency string) (Payment, error) {
	p := Payment{AccountID: accountID, Amount: amount}
	err := tx.QueryRow(ctx, chargeSQL, accountID, amount).Scan(&p.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := tx.QueryRow(ctx, accountExistsSQL, accountID).Scan(&exists); err != nil {
			return Payment{}, fmt.Errorf("payments: charge: %w", err)
		}
		if !exists {
			return Payment{}, ErrNoAccount
		}
		return Payment{}, ErrInsufficientFunds
	}
	if err != nil {
		return Payment{}, fmt.Errorf("payments: charge: %w", err)
	}
	if err := tx.QueryRow(ctx, insertPaymentSQL, accountID, amount, currency).Scan(&p.ID); err != nil {
		return Payment{}, fmt.Errorf("payments: record payment: %w", err)
	}
	return p, nil
}

type paymentRequest struct {
	AccountID int64  `json:"account_id"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
}

// handlePayment serves POST /payments.
//
// Refusals (400, 402, 404) are answers like any other: behind idemhttp they
// are stored with the key and replayed, and the transaction rolls back, so
// a refused payment moves no money however often it is retried.
func (s *service) handlePayment(r *http.Request, tx pgx.Tx) reply {
	var req paymentRequest
	if rep, ok := decode(r, &req); !ok {
		return rep
	}
	switch {
	case req.AccountID <= 0:
		return fail(http.StatusBadRequest, ProblemInvalidRequest, "account_id must be a positive integer")
	case req.Amount <= 0:
		return fail(http.StatusBadRequest, ProblemInvalidRequest, "amount must be a positive integer in minor units")
	case req.Currency != Currency:
		return fail(http.StatusBadRequest, ProblemInvalidRequest, "currency must be "+Currency)
	}
	p, err := charge(r.Context(), tx, req.AccountID, req.Amount, req.Currency)
	switch {
	case errors.Is(err, ErrNoAccount):
		return fail(http.StatusNotFound, ProblemNoSuchAccount, "no such account")
	case errors.Is(err, ErrInsufficientFunds):
		return fail(http.StatusPaymentRequired, ProblemInsufficientFunds, "the balance does not cover the amount")
	case err != nil:
		return s.internal(r, err)
	}
	return respond(http.StatusCreated, p)
}
