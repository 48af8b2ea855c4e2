package idem

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/sentinel"
)

// The errors Do returns for the states a caller branches on. Compare them with
// errors.Is: Do may wrap them with detail.
var (
	// ErrInProgress means another transaction holds the key right now. The
	// first request is still running; its outcome is unknown. Retrying later
	// with the same key is safe: it replays the first outcome, or runs the
	// operation if the first attempt rolled back. HTTP: 409 Conflict.
	ErrInProgress = errors.New("idem: a request with this key is in progress")

	// ErrMismatch means the key was already used with another request hash:
	// the client reused a key for a different request. fn did not run.
	// Retrying will fail the same way. HTTP: 422 Unprocessable Content.
	ErrMismatch = errors.New("idem: the key was used with a different request")

	// ErrInvalidKey means the key is empty, longer than 255 bytes, not valid
	// UTF-8, or holds a control character. Nothing was sent to the database.
	ErrInvalidKey = errors.New("idem: invalid idempotency key")

	// ErrInvalidScope means the scope is longer than 255 bytes, not valid
	// UTF-8, or holds a control character. Nothing was sent to the database.
	ErrInvalidScope = errors.New("idem: invalid scope")

	// ErrInvalidRequestHash means the request hash is empty, longer than 255
	// bytes, not valid UTF-8, or holds a control character. Nothing was sent
	// to the database.
	ErrInvalidRequestHash = errors.New("idem: invalid request hash")

	// ErrInvalidTable means a table name (Config.Table, or one given to
	// schema.ApplyTable) is not a plain, optionally schema-qualified,
	// lower-case identifier. Nothing was sent to the database.
	ErrInvalidTable = sentinel.ErrInvalidTable

	// ErrInvalidOption means an option or a Config field was given a value
	// outside its range (a negative TTL, a nil database), or a call asked for
	// what its database cannot give (REPEATABLE READ on a partitioned key
	// table, refused after the first round trip, before fn runs). Nothing was
	// written.
	ErrInvalidOption = sentinel.ErrInvalidOption

	// ErrOutcomeUnknown means the connection failed while COMMIT was on its
	// way: the transaction may or may not have committed, and Do cannot tell.
	// Retry with the same key: if it committed, the retry replays the stored
	// result; if not, the retry runs fn. Never retry with a new key. HTTP: a
	// 5xx that clients retry (503 with Retry-After).
	ErrOutcomeUnknown = errors.New("idem: the outcome is unknown (the connection failed during COMMIT); retry with the same key")

	// ErrTxOwned is returned by Commit and Rollback of the transaction handed
	// to fn: Do owns it. To roll back, return an error from fn.
	ErrTxOwned = errors.New("idem: the transaction belongs to idem; return from fn (or write the response) instead of committing or rolling back")

	// ErrCorruptRecord means a stored row could not be read back: it does
	// not decode into the result type (the type changed incompatibly, or
	// the result is a JSON object that shares no field with a struct result
	// type: another caller's result under the same scope and key), or a
	// Sealer could not open it, or its columns disagree with what was
	// sealed (the row was edited). fn did not run. Retrying will fail the
	// same way until the key expires or is forgotten (Client.Forget).
	ErrCorruptRecord = errors.New("idem: the stored result cannot be read back")

	// ErrKeyLost means the key's own row was not what the call found when
	// it came to store its result: where the claim inserted it, fn deleted
	// or updated it, or truncated the table; where the row is written only
	// at completion (a pool or connection at READ COMMITTED), fn wrote a row
	// of its own key. Nothing was committed; the call is a programming
	// error in fn and retrying will fail the same way.
	ErrKeyLost = errors.New("idem: the key's row was deleted, changed or written inside the call (does fn write to the key table?)")

	// ErrTxEnded means fn ended the call's transaction itself, with a raw
	// COMMIT, ROLLBACK, END or ABORT sent through Exec (the methods return
	// ErrTxOwned): whatever fn wrote before that may have committed without
	// the key, so a retry may repeat it. idem stored nothing and rolled back
	// what was still open. The call is a programming error in fn and
	// retrying will fail the same way.
	ErrTxEnded = errors.New("idem: fn ended the call's transaction (a COMMIT, ROLLBACK, END or ABORT sent through Exec); its earlier writes may have committed without the key")

	// ErrResultTooLarge means fn's result, encoded, exceeds
	// Config.MaxResultBytes. Nothing was stored and fn's writes rolled back;
	// retrying will fail the same way.
	ErrResultTooLarge = errors.New("idem: the result is too large to store")

	// ErrNoKey is returned by DeriveKey outside the work of a call: there is
	// no key to derive from.
	ErrNoKey = errors.New("idem: no idempotency key in the context (DeriveKey runs inside the work of Run, Wrap or idemhttp)")

	// ErrNotFound is returned by Client.Lookup for a key that has no row
	// and is not in progress.
	ErrNotFound = errors.New("idem: no such key")

	// ErrLeaseLost: an owner of an Operation lost its lease to another
	// owner (it paused past OperationConfig.Lease, or its renewals could not
	// reach the database) and recorded nothing after that; a database step
	// it was in rolled back. The operation goes on under the other owner: a
	// retry with the same key gets its answer, or ErrInProgress meanwhile.
	ErrLeaseLost = errors.New("idem: the operation's lease passed to another owner; this owner recorded nothing more")

	// ErrDeadline is the cause OperationConfig.Compensate receives: the
	// operation passed its OperationConfig.Deadline unfinished.
	ErrDeadline = errors.New("idem: the operation passed its deadline unfinished")
)

// Retryable reports whether err is worth retrying with the same key: the
// operation did not complete (or its outcome is unknown) for a reason that
// may pass. It is true for ErrInProgress, ErrOutcomeUnknown, ErrLeaseLost, serialization
// failures and deadlocks (SQLSTATE 40001, 40P01), lock timeouts (55P03), a
// session the server ended for idling (25P03, 57P05), and connection
// failures. It is false for nil, ErrMismatch, invalid input, a *Refusal, a
// cancelled statement (57014), context.Canceled, and any other error from
// fn.
//
// The timeouts, decided one by one:
//   - 55P03 lock_not_available (lock_timeout, NOWAIT): another transaction
//     holds what fn needs; it will end, and the retry can get it.
//   - 25P03 idle_in_transaction_session_timeout (Config.IdleTimeout): the
//     server ended the session because the client sent nothing for too
//     long: a frozen or partitioned process, or fn pausing longer than the
//     timeout. The transaction rolled back whole and the key is free; the
//     retry takes a fresh connection. 57P05 idle_session_timeout ends an idle
//     pooled connection the same way.
//   - 57014 query_canceled is statement_timeout, but also pg_cancel_backend
//     and a client's cancel request (pgx sends one when ctx ends, if it is
//     configured to cancel that way), and the code does not say which. Two
//     of the three are a decision to stop, as context.Canceled is; and a
//     statement that ran past the deployment's budget usually does so again,
//     adding load where there is already too much. A caller that knows its
//     statement timeouts come from passing load may retry anyway.
//
// Retrying with the same key is always safe with idem: at most one attempt
// commits, and every later one replays it. Retryable only says whether a
// retry can succeed where this attempt did not.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrInProgress) || errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrLeaseLost) {
		return true
	}
	var refusal *Refusal
	if errors.As(err, &refusal) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerrcode.SerializationFailure, pgerrcode.DeadlockDetected,
			pgerrcode.LockNotAvailable, pgerrcode.AdminShutdown,
			pgerrcode.CrashShutdown, pgerrcode.CannotConnectNow,
			pgerrcode.TooManyConnections,
			pgerrcode.IdleInTransactionSessionTimeout, pgerrcode.IdleSessionTimeout:
			return true
		}
		return pgerrcode.IsConnectionException(pgErr.Code)
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	// pgx reports a connection the server or network closed mid-exchange as
	// io.ErrUnexpectedEOF, and a later use of it as ErrConnClosed.
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr)
}

// inputError wraps a validation sentinel with what was wrong.
func inputError(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

// tableError adds what to do to err when a table of the key table's schema
// does not exist (SQLSTATE 42P01: the key table, or an operations' table
// of schema/002, which PostgreSQL's message names), for the calls that can
// meet a missing table: Sweep, Lookup, Forget, Stats and operations.
func tableError(table, op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
		// PostgreSQL's message names the table that is missing: the key
		// table, or one of the operations' tables (schema/002) beside it.
		return fmt.Errorf("idem: %s: a table of the key table %s's schema does not exist: %s: %w", op, table, applySchema, err)
	}
	return fmt.Errorf("idem: %s: %w", op, err)
}
