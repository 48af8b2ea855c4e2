// Package idemconsume processes messages from an at-least-once broker
// exactly once: each message's handler runs in the transaction of an idem
// key, and the broker is told to forget the message only after that
// transaction's COMMIT answered.
//
//	import "github.com/idemhq/idem/idemconsume"
//
// # The problem
//
// Brokers deliver at least once. A consumer that committed its writes and
// crashed before it acknowledged the message gets it again; so does one
// whose partition moved to another instance, and so does every consumer when
// a producer retried its publish. Acknowledging first loses the message
// instead. The fix is a key that commits in the same transaction as the
// handler's writes: a redelivery finds the key and is dropped.
//
// # The guarantee
//
// Consumer.Process runs the handler through idem.Run under the message's key,
// in the scope "consumer:" + Config.Name, and then settles the delivery
// through the adapter's Settler, never before Run returned:
//
//	Run's outcome                 action      why
//	executed                      Ack         the handler's writes and the key committed
//	replayed                      Ack         a duplicate: dropped, the handler does not run
//	refused (a *idem.Refusal)     Ack         a business refusal, stored with the key
//	in_progress                   Retry       another delivery holds the key: try later, never spin
//	outcome_unknown               Retry       COMMIT's answer was lost: the redelivery replays or runs
//	failed                        Retry, then DeadLetter once Config.MaxDeliveries is reached
//	mismatch (idem.ErrMismatch)   DeadLetter  the same key with another payload is never replayed
//	no key, invalid key           DeadLetter  there is nothing to deduplicate on
//
// So each message's effect commits once per consumer name: two consumers
// (two names) of one event each process it once, and one consumer, however
// many instances it runs, never twice, for as long as the key lives
// (idem.Config.TTL, 24 hours by default). A redelivery later than the TTL
// runs the handler again: keep the TTL above the longest redelivery the
// broker can make (a consumer stopped for a day, a replay from the start of a
// retained topic). Effects outside the database are not covered: the
// handler derives a key for them (idem.DeriveKey), as for any idem call.
//
// # The key
//
// The key is the producer's id for the message (Message.ID: an
// Idempotency-Key header, a CloudEvents id, NATS's Nats-Msg-Id, AMQP's
// message-id; ProducerID reads them), and only when there is none the
// broker's position of the message (Message.Position: topic, partition and
// offset; stream and sequence). A position catches redeliveries of one
// published message but not a producer's retried publish, which the broker
// stores at a new position. The request hash is the payload's
// (idem.HashBytes): a second message under a used key with another payload
// is dead-lettered with idem.ErrMismatch, never answered with the first's
// result.
//
// # Why a Settler and not a returned decision
//
// The order "commit, then acknowledge" is the whole guarantee, so it is
// written once, here, rather than in each adapter: Process calls exactly one
// of the Settler's methods, after Run returned, and none at all when ctx
// ended first (the broker then redelivers). The adapters (the idemkafka,
// idemnats and idemamqp modules) only translate the three actions into
// their broker's words.
//
// # Batches
//
// Consumer.ProcessBatch runs several messages in one transaction, each
// under its own key in a savepoint, and settles each as Process would
// have, after the batch's COMMIT answered; its documentation says what a
// batch costs, and when it retries every message of it.
//
// # Example
//
//	c, err := idemconsume.New(keys, &idemconsume.Config{Name: "ledger"},
//		func(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
//			var ev Settled
//			if err := json.Unmarshal(m.Payload, &ev); err != nil {
//				return idem.Refuse("malformed", err.Error()) // stored, acked, never retried
//			}
//			_, err := tx.Exec(ctx, `INSERT INTO ledger (payment, amount) VALUES ($1, $2)`, ev.ID, ev.Amount)
//			return err // nil: commits with the key; an error: rolled back, retried
//		})
//	...
//	res, err := c.Process(ctx, &idemconsume.Message{ID: id, Payload: body, Deliveries: n}, settler)
//
// docs/CONSUMERS.md compares the brokers' redeliveries and what each adapter
// does with them.
package idemconsume
