package payments

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/processor"
)

var (
	//go:embed sql/charge.sql
	chargeSQL string
	//go:embed sql/account_exists.sql
	accountExistsSQL string
	//go:embed sql/insert_payment.sql
	insertPaymentSQL string
	//go:embed sql/get_payment.sql
	getPaymentSQL string
)

// A Settler settles committed payments with the payment processor.
// Settle runs in the payment's transaction, right after the payment is
// recorded, with the request's context: what it writes in tx commits with
// the payment or not at all. An error fails the payment (503: the
// transaction rolls back and the Idempotency-Key stays free).
// settlement.Queue is the Settler of the service; settlement.Direct that
// of the demo's unprotected service.
type Settler interface {
	Settle(ctx context.Context, tx pgx.Tx, c processor.Charge) error
}

// Currency is the only currency the example accepts.
const Currency = string(api.USD)

// ErrInsufficientFunds means the balance does not cover the amount; nothing
// was charged.
var ErrInsufficientFunds = errors.New("payments: insufficient funds")

// charge takes amount from the account and records the payment, both in tx.
// It returns ErrNoAccount or ErrInsufficientFunds without charging anything.
func charge(ctx context.Context, tx pgx.Tx, accountID, amount int64, currency string) (api.Payment, error) {
	p := api.Payment{AccountId: accountID, Amount: amount}
	err := tx.QueryRow(ctx, chargeSQL, accountID, amount).Scan(&p.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := tx.QueryRow(ctx, accountExistsSQL, accountID).Scan(&exists); err != nil {
			return api.Payment{}, fmt.Errorf("payments: charge: %w", err)
		}
		if !exists {
			return api.Payment{}, ErrNoAccount
		}
		return api.Payment{}, ErrInsufficientFunds
	}
	if err != nil {
		return api.Payment{}, fmt.Errorf("payments: charge: %w", err)
	}
	if err := tx.QueryRow(ctx, insertPaymentSQL, accountID, amount, currency).Scan(&p.Id); err != nil {
		return api.Payment{}, fmt.Errorf("payments: record payment: %w", err)
	}
	return p, nil
}

// CreatePayment serves POST /payments: it charges the API key's own
// account. The Idempotency-Key in params is idemhttp's business, in front.
func (s *server) CreatePayment(w http.ResponseWriter, r *http.Request, _ api.CreatePaymentParams) {
	s.payWrite(w, r, s.pay)
}

// pay is POST /payments's work, in the request's transaction.
//
// Its refusals are answers like any other. Validation failures (400) are
// not stored: the transaction rolls back and the key stays free, so the
// client can correct the body and retry with the same key. Insufficient
// funds (402) and an account that is not the caller's (404) report the
// outcome of a payment that was tried: behind idemhttp they are stored with
// the key and replayed, and the transaction rolls back, so a refused
// payment moves no money however often it is retried.
func (s *server) pay(r *http.Request, tx pgx.Tx) reply {
	var req api.PaymentRequest
	if rep, ok := decode(r, &req, "account_id", "amount", "currency"); !ok {
		return rep
	}
	switch {
	case req.AccountId <= 0:
		return invalid("account_id must be a positive integer")
	case req.Amount <= 0:
		return invalid("amount must be a positive integer in minor units")
	case string(req.Currency) != Currency:
		return invalid("currency must be " + Currency)
	}
	if own, _ := accountFrom(r.Context()); req.AccountId != own {
		// Another account's, or none: the same answer, so that existence
		// does not leak.
		return fail(http.StatusNotFound, ProblemNoSuchAccount, "no such account")
	}
	p, err := charge(r.Context(), tx, req.AccountId, req.Amount, string(req.Currency))
	switch {
	case errors.Is(err, ErrNoAccount):
		return fail(http.StatusNotFound, ProblemNoSuchAccount, "no such account")
	case errors.Is(err, ErrInsufficientFunds):
		return fail(http.StatusPaymentRequired, ProblemInsufficientFunds, "the balance does not cover the amount")
	case err != nil:
		return s.internal(r, err)
	}
	if s.settler != nil {
		c := processor.Charge{PaymentID: p.Id, AccountID: p.AccountId, Amount: p.Amount, Currency: string(req.Currency)}
		if err := s.settler.Settle(r.Context(), tx, c); err != nil {
			s.log.ErrorContext(r.Context(), "settlement failed", "payment_id", p.Id, "err", err)
			return fail(http.StatusServiceUnavailable, idemhttp.ProblemUnavailable,
				"the payment could not be settled; retry with the same Idempotency-Key")
		}
	}
	return respond(http.StatusCreated, p)
}

// GetPayment serves GET /payments/{id} for the API key's own payments:
// whether the processor has charged it, and its charge. Another account's
// payment is answered 404, exactly as a missing one. It reads through the
// pool.
func (s *server) GetPayment(w http.ResponseWriter, r *http.Request, id int64) {
	own, _ := accountFrom(r.Context())
	var p api.PaymentStatus
	err := s.pool.QueryRow(r.Context(), getPaymentSQL, id, own).Scan(&p.Id, &p.AccountId, &p.Amount, &p.ProcessorId)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		fail(http.StatusNotFound, ProblemNoSuchPayment, "no such payment").write(w)
		return
	case err != nil:
		s.internal(r, fmt.Errorf("payments: read payment: %w", err)).write(w)
		return
	}
	p.Settled = p.ProcessorId != nil
	respond(http.StatusOK, p).write(w)
}
