package settlement

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/payments_example/processor"
)

// Direct settles a payment inside its request, as code without idem
// would: it calls the processor with a new key on every attempt and
// records the charge in the payment's transaction. It exists to show what
// Queue prevents; never use it. A retried request is charged again, and a
// charge whose answer is lost, or whose transaction then rolls back, is a
// charge for a payment that does not exist.
type Direct struct {
	Processor *processor.Client
}

// Settle charges c at the processor under a new key and records the
// charge in tx. ctx bounds the call (CallTimeout at most).
func (d Direct) Settle(ctx context.Context, tx pgx.Tx, c processor.Charge) error {
	callCtx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	id, err := d.Processor.Charge(callCtx, uuid.NewString(), c)
	if err != nil {
		return fmt.Errorf("settlement: %w", err)
	}
	return record(ctx, tx, c.PaymentID, id)
}
