package settlement

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/payments_example/processor"
)

// Queue settles payments through River: Settle inserts a job that Worker
// runs once the payment has committed.
type Queue struct {
	river *river.Client[pgx.Tx]
}

// NewQueue returns a Queue that inserts jobs with client (NewClient's, or
// any River client on the same database: inserting needs no workers).
func NewQueue(client *river.Client[pgx.Tx]) *Queue { return &Queue{river: client} }

// Settle inserts the settlement job of charge c in tx, the payment's own
// transaction: it commits with the payment or not at all. ctx must be the
// context of the work of an idem call (an idemhttp request's), whose key
// the processor's key is derived from; without one Settle fails with
// idem.ErrNoKey and nothing is inserted, since a settlement without a
// stable key could be charged twice.
func (q *Queue) Settle(ctx context.Context, tx pgx.Tx, c processor.Charge) error {
	key, err := idem.DeriveKey(ctx, Purpose(c.PaymentID))
	if err != nil {
		return fmt.Errorf("settlement: %w", err)
	}
	if _, err := q.river.InsertTx(ctx, tx, Args{Charge: c, Key: key}, nil); err != nil {
		return fmt.Errorf("settlement: insert the job of payment %s: %w", c.PaymentID, err)
	}
	return nil
}
