package dbtx

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// CommitOutcome is what the round trip that carried COMMIT says about the
// transaction.
type CommitOutcome int

const (
	// Committed means COMMIT's own reply confirmed it.
	Committed CommitOutcome = iota
	// RolledBack means nothing committed, and the server said so (an error
	// reply to COMMIT or to a statement before it), or nothing was sent.
	RolledBack
	// Unknown means COMMIT was sent and its reply never came; the transaction
	// may or may not have committed.
	Unknown
)

// ClassifyCommit decides a round trip whose statements 0..commitAt-1 were
// sent before COMMIT, at index commitAt, in one pipeline. failed is the
// index of the first result that failed, err its error; failed < 0 means
// none did, and failed > commitAt a failure after COMMIT's reply (the
// pipeline's closing ReadyForQuery, say).
//
// The outcome is decided by COMMIT's own reply, because PostgreSQL answers
// the statements of a pipeline in order and ends a session only after what
// it has already answered:
//   - COMMIT answered "COMMIT": committed, whatever arrives after it (a
//     FATAL from pg_terminate_backend, a reset).
//   - COMMIT, or a statement before it, answered with an ERROR: the
//     transaction aborted and nothing committed. So did a FATAL in reply to
//     a statement before COMMIT: the session ended before it read COMMIT.
//   - No reply to COMMIT (a FATAL instead of it, a closed connection, a
//     timeout, or a connection that failed while an earlier reply was
//     awaited, since COMMIT had been sent with it): unknown, unless pgx
//     reports that nothing left the client (pgconn.SafeToRetry).
func ClassifyCommit(failed, commitAt int, err error) CommitOutcome {
	switch {
	case err == nil || failed < 0 || failed > commitAt:
		return Committed
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return RolledBack
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (failed < commitAt || !endsSession(pgErr)) {
		return RolledBack
	}
	if pgconn.SafeToRetry(err) {
		return RolledBack
	}
	return Unknown
}

// CommitOutcomeUnknown reports whether err, returned by a COMMIT sent on
// its own (pgx.Tx.Commit), leaves the outcome unknown. pgx's Commit does not
// expose COMMIT's reply apart from a FATAL that follows it, so a FATAL
// counts as no reply: the outcome is unknown, never a false "failed".
func CommitOutcomeUnknown(err error) bool {
	return err != nil && ClassifyCommit(0, 0, err) == Unknown
}

// endsSession reports a FATAL or PANIC: the server ended the session rather
// than answering the statement.
func endsSession(e *pgconn.PgError) bool {
	sev := e.SeverityUnlocalized
	if sev == "" {
		sev = e.Severity
	}
	return sev == "FATAL" || sev == "PANIC"
}
