// Package idem runs an operation at most once per idempotency key, in the
// same PostgreSQL transaction as the operation's own writes.
//
//	import "github.com/idemhq/idem/idem"
//
// # The problem
//
// A server commits a charge, the answer is lost on the wire, the client times
// out and retries, and the customer pays twice. The remedy is an
// idempotency key (a UUID the client sends with each critical request): the
// server runs the operation once per key and answers every retry with the
// first answer.
//
// # The guarantee
//
// Do claims the key (under its advisory lock, checked against the table's
// row for the key), runs fn and stores its result in one transaction. The key, fn's writes and the stored result
// commit together or roll back together, so there is no second system to
// drift out of step with the database:
//
//   - success: stored, and replayed to every retry with the same key;
//   - a business refusal (a *Refusal: declined, insufficient funds): fn's
//     writes roll back, the refusal is stored and replayed;
//   - a technical failure (an error, a panic, a lost connection, a failed
//     COMMIT): nothing is stored and the key stays free, so the retry runs;
//   - the same key with a different request: ErrMismatch;
//   - the same key while the first request still runs: ErrInProgress at once;
//     a first request that went silent (a frozen process, a network
//     partition) holds its key at most Config.IdleTimeout, 60 seconds by
//     default, before the server rolls it back.
//
// A key is replayed for a TTL after it completed (24 hours by default) and
// deleted by Sweep afterwards. At scale the table can be partitioned by claim
// time (schema.ApplyPartitioned): Sweep then drops whole partitions instead of
// deleting rows. The contract is the same, except that REPEATABLE READ is
// refused there (docs/SCALING.md says why). Do's documentation states the
// contract in full.
//
// # Example
//
//	keys, err := idem.NewClient(pool, &idem.Config{TTL: 24 * time.Hour}) // once, at start-up
//	...
//	ctx = idem.ContextWithScope(ctx, userID) // per request: keys are per user
//	hash, _ := idem.HashJSON(req)
//	payment, err := idem.Do(ctx, keys, key, hash, func(tx pgx.Tx) (Payment, error) {
//		var p Payment
//		err := tx.QueryRow(ctx,
//			`UPDATE accounts SET balance = balance - $1 WHERE id = $2 AND balance >= $1
//			 RETURNING balance`, req.Amount, req.AccountID).Scan(&p.Balance)
//		if errors.Is(err, pgx.ErrNoRows) {
//			return p, ErrInsufficientFunds // an idem.Refusal: stored and replayed
//		}
//		return p, err
//	})
//
// Run does the same and also reports the Outcome (executed, replayed, ...)
// and gives fn a context carrying the key, from which CallKey.Derive makes
// the key for a downstream service. Wrap does it for a service method, and
// the idemhttp package for an HTTP handler. The tables come from the schema
// package (or every schema/[0-9]*.sql, applied in order).
//
// # Configuration
//
// What a deployment shares (the table, the TTL, a Sealer, an Observer, a
// logger, limits, the idle timeout) goes in a Config, which NewClient checks
// once; the Client is then passed wherever a database is expected. What varies per call
// (WithWait, WithTxOptions, WithObserver) is an Option. The scope, which
// varies per request, travels in the context (ContextWithScope). A plain
// pool works too, with the defaults, until a Client with other settings is
// made on it: from then on a call given the pool itself fails with
// ErrInvalidOption, so that no call site can bypass the deployment's table,
// TTL or Sealer by passing the pool instead of the Client.
//
// # Cost
//
// With a pool or a connection, a first execution on a warm connection takes
// no round trip beyond those of the bare transaction: the claim travels in
// the pipeline that carries BEGIN, and the stored result in the one that
// carries COMMIT. The first call on a connection adds one round trip for the
// table's layout and prepares its statements. A replay is one round trip
// that takes no lock and writes nothing.
//
// # Work too long for one transaction
//
// Do holds its transaction, a connection and the key for the whole of fn. For
// work that calls a slow service (a card processor), an Operation (see
// NewOperation) runs under the same key as steps: each database step (Step) is
// a short transaction that commits its writes with the step's record, each
// external step (External) runs with no transaction open and a key derived
// from the operation's, and the last step stores the answer, which replays as
// Do's. A retry, or a completer (package idemriver), continues an unfinished
// operation from its last recorded step; a lease and a fencing token keep one
// owner at a time (operation.go has the protocol).
//
// # Running it
//
// Client.Lookup shows what a key holds, Client.Forget resets a key,
// Client.Sweep and Client.SweepEvery delete expired keys, Client.Stats reads
// the table's health, and an Observer sees every call.
package idem
