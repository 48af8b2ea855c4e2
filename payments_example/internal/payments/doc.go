// Package payments is the business code of the payments example: accounts,
// payments and the HTTP API that serves them.
//
// Every write runs in the request's transaction. NewHandler puts the write
// endpoints behind idemhttp, so the Idempotency-Key, the charge and the
// stored answer commit together or not at all: a client that lost an answer
// retries with the same key and receives the first answer again, without a
// second charge. NewUnprotectedHandler serves the same endpoints with the
// same business code in a plain transaction per request, without key
// handling; the demo runs both to show what the key prevents.
//
// The charge itself is a single conditional UPDATE (sql/charge.sql), so no
// amount of concurrency can take a balance below zero; a CHECK constraint
// backs it up.
package payments
