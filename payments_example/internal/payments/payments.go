package payments

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"

	"github.com/google/uuid"
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

// charge takes amount from the account and records the payment, with a
// random id (UUID version 4, which reveals neither the payment volume nor
// the time), both in tx. It returns ErrNoAccount or ErrInsufficientFunds
// without charging anything.
func charge(ctx context.Context, tx pgx.Tx, accountID uuid.UUID, amount int64, currency string) (api.Payment, error) {
	p := api.Payment{Id: uuid.New(), AccountId: accountID, Amount: amount}
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
	if _, err := tx.Exec(ctx, insertPaymentSQL, p.Id, accountID, amount, currency); err != nil {
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
// Its refusals are answers like any other, and move no money: the
// transaction rolls back. Validation failures (400) are not stored: the
// key stays free, so the client can correct the body and retry with the
// same key. Insufficient funds (402) reports the outcome of a payment that
// was tried on the caller's own account: behind idemhttp it is stored with
// the key and replayed. An account that is not the caller's (404) is not
// stored either (idemhttp.NoStore): the caller named something it cannot
// see, a replay of that would tell it nothing new, and storing it would
// let any client fill the key table with refusals that cost it nothing.
func (s *server) pay(r *http.Request, tx pgx.Tx) reply {
	var req api.PaymentRequest
	if rep, ok := decode(r, &req, "account_id", "amount", "currency"); !ok {
		return rep
	}
	switch {
	case req.AccountId == uuid.Nil:
		return invalid("account_id must be an account's id")
	case req.Amount <= 0:
		return invalid("amount must be a positive integer in minor units")
	case string(req.Currency) != Currency:
		return invalid("currency must be " + Currency)
	}
	if own, _ := accountFrom(r.Context()); req.AccountId != own {
		// Another account's, or none: the same answer, so that existence
		// does not leak.
		return noSuchAccount(r)
	}
	p, err := charge(r.Context(), tx, req.AccountId, req.Amount, string(req.Currency))
	switch {
	case errors.Is(err, ErrNoAccount):
		return noSuchAccount(r)
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

// noSuchAccount is POST /payments's 404, marked not to be stored under the
// key (see pay).
func noSuchAccount(r *http.Request) reply {
	idemhttp.NoStore(r.Context())
	return fail(http.StatusNotFound, ProblemNoSuchAccount, "no such account")
}

// GetPayment serves GET /payments/{id} for the API key's own payments:
// whether the processor has charged it, and its charge. Another account's
// payment is answered 404, exactly as a missing one. It reads through the
// pool.
func (s *server) GetPayment(w http.ResponseWriter, r *http.Request, id uuid.UUID) {
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
