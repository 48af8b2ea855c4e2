// Package payments is the business code of the payments example: accounts,
// API keys, payments, and the HTTP API that serves them, which implements
// the server interface generated from ../../openapi.yaml (package api).
//
// Clients sign up with POST /accounts and receive an account, with the
// fixed OpeningBalance, and an API key, shown once and stored only as its
// SHA-256 hash. Account and payment ids are random UUIDs, which tell
// nobody how many there are. Every other operation but the health check
// and the spec requires the key as a Bearer token and acts on its own
// account only; another account's resources are answered 404, as missing
// ones. The API serves no metrics: the command serves them on a listener
// of its own.
//
// Every payment runs in the request's transaction. NewHandler puts
// POST /payments behind a per-account rate limit and idemhttp, with the
// API key's account as the idempotency scope (a request without an
// account is refused, never run in a shared scope), so the
// Idempotency-Key, the charge and the stored answer commit together or not
// at all: a client that lost an answer retries with the same key and
// receives the first answer again, without a second charge. NewUnprotectedHandler serves the same API with the same
// business code in a plain transaction per payment, without key handling;
// the demo runs both to show what the key prevents.
//
// The charge itself is a single conditional UPDATE (sql/charge.sql), so no
// amount of concurrency can take a balance below zero; a CHECK constraint
// backs it up.
//
// A Settler, when the handler has one, settles each payment at the payment
// processor from the payment's transaction: package settlement inserts a
// River job there, which charges the processor once the payment has
// committed. GET /payments/{id} tells whether a payment is settled, and by
// which charge of the processor.
//
// POST /charges, when the handler has Charges, charges at the processor
// before it answers instead: an idem.Operation whose steps take the amount,
// call the processor with no transaction open and record its charge, each
// database step a short transaction of its own (Charges says which). It is
// served by idemhttp's handler for operations, under the same key rules
// and rate limit as POST /payments. A charge whose client gives up is
// finished by the completer (package idemriver) that the command runs on
// the settlement River client; a retry with its key continues it.
package payments
