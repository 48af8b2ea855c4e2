package payments

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/processor"
)

var (
	//go:embed sql/record_charge.sql
	recordChargeSQL string
	//go:embed sql/undo_payment.sql
	undoPaymentSQL string
)

// ChargeCallTimeout bounds one call of POST /charges to the processor, or
// half the operation's lease if that is shorter: the 4 s of
// settlement.CallTimeout, so that the completer's run of a charge, on the
// settlement River client, fits its JobTimeout.
const ChargeCallTimeout = 4 * time.Second

// ChargeOperation is the name of POST /charges's operation: the name its
// completer jobs (package idemriver) find it by.
const ChargeOperation = "payments.charge"

// The codes of POST /charges's refusals (idem.Refusal.Code), answered 402
// and stored under the key.
const (
	// RefusalInsufficientFunds: the balance does not cover the amount;
	// nothing was taken.
	RefusalInsufficientFunds = "insufficient_funds"
	// RefusalChargeDeclined: the processor refused the charge itself
	// (processor.ErrRejected); the amount went back to the account and the
	// payment was deleted.
	RefusalChargeDeclined = "charge_declined"
)

// ChargesConfig is NewCharges's settings. The zero value means the
// defaults each field states.
type ChargesConfig struct {
	// Lease is the operation's lease (idem.OperationConfig.Lease): how
	// soon a charge whose service died is taken up again, by a client's
	// retry or by the completer. Defaults to idem.DefaultLease (30s).
	Lease time.Duration

	// OnStart runs in the transaction that begins each charge
	// (idem.OperationConfig.OnStart): idemriver.OnStart, which inserts the
	// completer's job, so that a charge whose client gave up is finished
	// anyway. Defaults to none: such a charge stays unfinished, its amount
	// taken, until its client retries.
	OnStart func(ctx context.Context, tx pgx.Tx, ref idem.OperationRef) error
}

// Charges is the work of POST /charges: a charge at the payment processor
// while the client waits, as an idem.Operation of steps, none of which
// holds a transaction open during the processor's call:
//
//	reserve  database: take the amount from the account and record the
//	         payment (sql/charge.sql, sql/insert_payment.sql); a balance
//	         that does not cover it is refused (RefusalInsufficientFunds)
//	charge   external: the processor's charge, with the key the operation
//	         derives for this step (the payment's id is in the step's
//	         name, so that a key reused after it expired never meets the
//	         processor's memory of the old payment); bounded by
//	         ChargeCallTimeout
//	record   database: the processor's charge on the payment
//	         (sql/record_charge.sql), and the answer
//
// A processor that refuses the charge itself (processor.ErrRejected) gets
// an undo step instead of the last (sql/undo_payment.sql) and a refusal
// (RefusalChargeDeclined). A step that failed leaves the charge
// unfinished: a retry with the key, or the completer, continues it from
// its last recorded step. Charges is an idem.Resumer, for idemriver's
// Worker.
type Charges struct {
	keys        *idem.Client
	proc        *processor.Client
	op          *idem.Operation[chargeRequest, api.Charge]
	callTimeout time.Duration
}

// chargeRequest is what a charge stores and hashes: the body of
// POST /charges and the account of its API key.
type chargeRequest struct {
	AccountID uuid.UUID `json:"account_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
}

// NewCharges returns the charges of keys (an idem.Client on the service's
// pool) at the processor proc, under cfg (nil: the defaults). A nil keys
// or proc, or a Lease the operation refuses, is an error.
func NewCharges(keys *idem.Client, proc *processor.Client, cfg *ChargesConfig) (*Charges, error) {
	if keys == nil || proc == nil {
		return nil, errors.New("payments: NewCharges needs an idem.Client and a processor")
	}
	if cfg == nil {
		cfg = &ChargesConfig{}
	}
	lease := idem.DefaultLease
	if cfg.Lease > 0 {
		lease = cfg.Lease
	}
	c := &Charges{keys: keys, proc: proc, callTimeout: min(ChargeCallTimeout, lease/2)}
	op, err := idem.NewOperation(keys, ChargeOperation, c.charge,
		&idem.OperationConfig[chargeRequest, api.Charge]{Lease: cfg.Lease, OnStart: cfg.OnStart})
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	c.op = op
	return c, nil
}

// Name returns ChargeOperation.
func (c *Charges) Name() string { return c.op.Name() }

// Resume drives the unfinished charge under scope and key to its end, as
// idem.Operation.Resume does: for the completer.
func (c *Charges) Resume(ctx context.Context, scope, key string) (idem.Outcome, error) {
	return c.op.Resume(ctx, scope, key)
}

// charge is the operation's function: its steps, in order.
func (c *Charges) charge(s *idem.Steps, req chargeRequest) (api.Charge, error) {
	p, err := idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (api.Payment, error) {
		p, err := charge(ctx, tx, req.AccountID, req.Amount, req.Currency)
		if errors.Is(err, ErrInsufficientFunds) {
			return p, idem.Refuse(RefusalInsufficientFunds, "the balance does not cover the amount").WithStatus(http.StatusPaymentRequired)
		}
		return p, err
	})
	if err != nil {
		return api.Charge{}, err
	}
	id, err := idem.External(s, "charge/"+p.Id.String(), func(ctx context.Context, key string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, c.callTimeout)
		defer cancel()
		return c.proc.Charge(ctx, key, processor.Charge{PaymentID: p.Id, AccountID: p.AccountId, Amount: p.Amount, Currency: req.Currency})
	})
	if errors.Is(err, processor.ErrRejected) {
		return c.undo(s, p)
	}
	if err != nil {
		return api.Charge{}, err
	}
	return idem.Step(s, "record", func(ctx context.Context, tx pgx.Tx) (api.Charge, error) {
		tag, err := tx.Exec(ctx, recordChargeSQL, p.Id, id)
		if err != nil {
			return api.Charge{}, fmt.Errorf("payments: record the charge of payment %s: %w", p.Id, err)
		}
		if tag.RowsAffected() != 1 {
			return api.Charge{}, fmt.Errorf("payments: payment %s is gone or holds another charge", p.Id)
		}
		return api.Charge{Id: p.Id, AccountId: p.AccountId, Amount: p.Amount, Balance: p.Balance, ProcessorId: id}, nil
	})
}

// undo gives a declined payment's amount back and refuses the charge.
func (c *Charges) undo(s *idem.Steps, p api.Payment) (api.Charge, error) {
	if _, err := idem.Step(s, "undo", func(ctx context.Context, tx pgx.Tx) (bool, error) {
		if _, err := tx.Exec(ctx, undoPaymentSQL, p.Id, p.AccountId); err != nil {
			return false, fmt.Errorf("payments: undo payment %s: %w", p.Id, err)
		}
		return true, nil
	}); err != nil {
		return api.Charge{}, err
	}
	return api.Charge{}, idem.Refuse(RefusalChargeDeclined, "the processor declined the charge; the amount went back to the account").
		WithStatus(http.StatusPaymentRequired)
}

// errInvalidCharge is decodeCharge's error; idemhttp answers it 400 with
// a fixed detail.
var errInvalidCharge = errors.New("payments: not a valid charge request")

// decodeCharge reads POST /charges's body, as strictly as decode reads
// POST /payments's, and completes it with the API key's account, which
// requireAccount, in front, has put in the context.
func decodeCharge(r *http.Request, body []byte) (chargeRequest, error) {
	var req api.ChargeRequest
	if _, ok := decodeBody(body, &req, "amount", "currency"); !ok {
		return chargeRequest{}, errInvalidCharge
	}
	if req.Amount <= 0 || string(req.Currency) != Currency {
		return chargeRequest{}, errInvalidCharge
	}
	account, ok := accountFrom(r.Context())
	if !ok {
		return chargeRequest{}, errNoCredentials
	}
	return chargeRequest{AccountID: account, Amount: req.Amount, Currency: string(req.Currency)}, nil
}

// CreateCharge serves POST /charges through the operation's handler
// (idemhttp.NewOperationHandler), or answers 501 when the service runs
// without a processor.
func (s *server) CreateCharge(w http.ResponseWriter, r *http.Request, _ api.CreateChargeParams) {
	if s.charges == nil {
		fail(http.StatusNotImplemented, "about:blank", "this service runs without a payment processor and does not charge synchronously").write(w)
		return
	}
	s.charges.ServeHTTP(w, r)
}
