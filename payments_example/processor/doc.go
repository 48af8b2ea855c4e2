// Package processor is the payment processor's side of the payments
// example: the protocol the service speaks to it (Client), and a fake
// processor that keeps its word on idempotency keys and misbehaves on
// demand (Fake), for the demo and the tests.
//
// The protocol is a simplified card processor's:
//
//	POST {base}/charges
//	Idempotency-Key: <key>
//	Content-Type: application/json
//
//	{"payment_id": 42, "account_id": 7, "amount": 2500, "currency": "USD"}
//
// answered 201 {"id": "<charge id>"}. The processor charges once per key:
// the same key with the same body is answered the same charge again; the
// same key with another body is refused 422. It may also answer 5xx, take
// too long, or charge and then lose its answer, and the caller cannot tell
// a lost answer from a charge that never happened: only a retry with the
// same key and body is safe.
package processor
