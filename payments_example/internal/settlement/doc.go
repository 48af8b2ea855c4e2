// Package settlement settles the payments example's payments with the
// payment processor, exactly once each, through River
// (github.com/riverqueue/river), PostgreSQL's own job queue.
//
// POST /payments runs in the request's transaction, behind idemhttp.
// Queue.Settle inserts a settlement job there, with River's InsertTx, next
// to the payment and the Idempotency-Key: the job exists if and only if
// the payment committed. The job carries the charge and a key derived from
// the request's Idempotency-Key (idem.DeriveKey), fixed when the job is
// inserted.
//
// Worker runs the job: it asks the processor for the charge under that
// key, and then, in one transaction, records the processor's charge id on
// the payment and completes the job (river.JobCompleteTx). Every failure
// (a 5xx, a timeout, a lost answer, a crash of the service, a database
// restart) leaves the job to be run again; every run sends the same key and
// the same charge, so the processor charges once and answers the same id,
// and recording that id again changes nothing. NewClient sets River's
// timeouts and retry policy so that a job interrupted at any point is run
// again within seconds (see its constants for the values and why they are
// safe).
//
// Direct is the opposite, for the demo's unprotected service: it calls the
// processor inside the request with a new key per attempt, as code without
// idem would, so that every retry is charged again.
package settlement
