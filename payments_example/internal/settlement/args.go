package settlement

import (
	"github.com/google/uuid"
	"github.com/riverqueue/river"

	"github.com/idemhq/idem/payments_example/processor"
)

// QueueName is the River queue of settlement jobs: a queue of their own,
// so that other work cannot hold them up.
const QueueName = "settlement"

// Args is a settlement job: the charge to ask the processor for, and the
// idempotency key to ask with. Both are fixed when the job is inserted, so
// that every run of the job sends the processor the same request.
type Args struct {
	processor.Charge
	// Key is the processor's Idempotency-Key for this charge, derived
	// from the request's (see Purpose).
	Key string `json:"idempotency_key"`
}

// Kind is the River job kind of settlement jobs.
func (Args) Kind() string { return "settle_payment" }

// InsertOpts puts settlement jobs on their queue and lets them be retried
// MaxAttempts times.
func (Args) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueName, MaxAttempts: MaxAttempts}
}

// Purpose is what the processor key of payment's settlement is derived
// for: idem.DeriveKey(ctx, Purpose(payment)). The payment's id is part of
// it, so that two payments never share a processor key, even when a client
// reuses an Idempotency-Key after it expired (the derived key would
// otherwise come back the same, with another payment: a processor refuses
// that, 422).
func Purpose(payment uuid.UUID) string { return "payments/settle/" + payment.String() }
