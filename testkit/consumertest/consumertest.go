// Package consumertest is the consumer storm the broker adapters
// (idemkafka, idemnats, idemamqp) run in their tests: one producer, several
// consumer instances that are killed mid-handler and between COMMIT and the
// ack, replaced, joined and left, poison messages, and a reconciliation
// from a table with no unique constraint. The same storm runs with a bare
// at-least-once consumer (the same handler in a plain transaction, acked
// after COMMIT) for comparison.
//
// The instances run in the test process, killed by cancelling their
// context (Storm.Run), or each in a process of its own, the test binary
// started again, killed with SIGKILL (Storm.RunProcesses, with Child in
// the binary's TestMain).
package consumertest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idemconsume"
)

// EffectsSQL creates the table the handler writes one row to per message it
// processes. It has no unique constraint, so a message processed twice shows
// as two rows.
const EffectsSQL = `CREATE TABLE IF NOT EXISTS effects (consumer text NOT NULL, msg text NOT NULL)`

// Name is the consumer name of the storm's consumers.
const Name = "storm"

// Handler is the storm's handler: it records the message (its payload is the
// message's name) and fails for the poison ones. A delivery the storm chose
// to kill mid-handler ends its instance here, after the write and before
// COMMIT.
func Handler(poison func(msg string) bool) idemconsume.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
		msg := string(m.Payload)
		if _, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1, $2)", Name, msg); err != nil {
			return err
		}
		if kill, ok := ctx.Value(killKey{}).(context.CancelFunc); ok {
			kill()
			<-ctx.Done()
			return ctx.Err()
		}
		if poison(msg) {
			return errors.New("poison message")
		}
		return nil
	}
}

// Bare is an at-least-once consumer without idem: h runs in a plain
// transaction, the delivery is acked after COMMIT answered, retried after a
// failure and dead-lettered after max deliveries. It is what a careful
// hand-written consumer does, and what the storm compares idem to.
type Bare struct {
	DB      *pgxpool.Pool
	Handler idemconsume.Handler
	Max     int
	Backoff time.Duration
}

// Process implements idemconsume.Processor.
func (b *Bare) Process(ctx context.Context, m *idemconsume.Message, s idemconsume.Settler) (idemconsume.Result, error) {
	err := pgx.BeginFunc(ctx, b.DB, func(tx pgx.Tx) error { return b.Handler(ctx, tx, m) })
	switch {
	case err == nil:
		return idemconsume.Result{Action: idemconsume.Ack}, s.Ack(ctx)
	case ctx.Err() != nil:
		return idemconsume.Result{Action: idemconsume.Retry, Err: err}, ctx.Err()
	case max(m.Deliveries, 1) < b.Max:
		return idemconsume.Result{Action: idemconsume.Retry, Delay: b.Backoff, Err: err}, s.Retry(ctx, b.Backoff)
	default:
		return idemconsume.Result{Action: idemconsume.DeadLetter, Err: err}, s.DeadLetter(ctx, fmt.Errorf("delivery limit: %w", err))
	}
}
