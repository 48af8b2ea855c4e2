// Package deposits credits the payments example's accounts with the
// deposits announced on a NATS JetStream stream, each exactly once,
// however often the stream delivers it.
//
// A deposit event is a JSON Deposit published to Subject, with the
// producer's id for it in the Nats-Msg-Id header. The service consumes
// the stream through the durable consumer ConsumerName (Subscribe makes
// it, and the stream when it is missing), with idemconsume and its
// JetStream adapter, idemnats: Handler credits the account and records
// the credit in the deposits table in the transaction in which the
// event's key commits, and the message is acknowledged only after that
// transaction's COMMIT answered. So a redelivery (the service died before
// its acknowledgement reached the server) and a producer's second publish
// later than the stream's duplicate window are both dropped as
// duplicates: the key is the producer's id, in the scope
// "consumer:deposits". An event that can never be credited (malformed, or
// for an unknown account) is refused: the refusal is stored with the key
// and the message acknowledged.
//
// The deposits table has no unique constraint on the event's id, so that
// a second credit of one event would show: the key alone keeps it out.
// ConsumeUnprotected is the opposite, for the demo's unprotected service:
// the same credit in a plain transaction per delivery, acknowledged after
// COMMIT, which credits every redelivery and every second publish again.
package deposits
