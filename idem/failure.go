package idem

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/dbtx"
)

// lastTripError turns the failure of the round trip that carries COMMIT,
// COMMIT at index commitAt, into the call's error, or nil when COMMIT's own
// reply confirmed it (dbtx.ClassifyCommit: whatever arrives after that reply,
// a FATAL from pg_terminate_backend, say, does not undo the commit). keyAt is
// the completing statement's index, whose deliberate failures the call's
// protocol explains.
func lastTripError(c *call, failed, keyAt, commitAt int, err error) error {
	switch dbtx.ClassifyCommit(failed, commitAt, err) {
	case dbtx.Committed:
		return nil
	case dbtx.Unknown:
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	if failed == keyAt {
		if kerr := c.proto.completeError(err); kerr != nil {
			return kerr
		}
	}
	switch {
	case failed < commitAt:
		// The server refused a statement before COMMIT (a trigger on the key
		// table, say), or ended the session before it read COMMIT: the
		// transaction aborted and nothing committed.
		return fmt.Errorf("idem: store result: %w", err)
	}
	return fmt.Errorf("idem: commit: %w", err)
}

// commitError classifies the failure of a COMMIT sent on its own through
// pgx.Tx.Commit, which cannot show COMMIT's reply apart from a FATAL that
// follows it: such a FATAL leaves the outcome unknown, never a false
// "failed". An outer transaction's savepoint release commits nothing, so
// its failure is a plain one: the caller's COMMIT decides.
func commitError(err error, ownsCommit bool) error {
	if ownsCommit && dbtx.CommitOutcomeUnknown(err) {
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("idem: commit: %w", err)
}

// isKeyLost reports whether the completing statement found no claimed row:
// its deliberate division by zero.
func isKeyLost(err error) bool { return isDivisionByZero(err) }

// isDivisionByZero reports the deliberate failure of idem's asserting
// statements (SQLSTATE 22012).
func isDivisionByZero(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.DivisionByZero
}

// isTxEnded reports the completing statement's guard against a transaction
// that is not the claim's: its cast of a sentence to int (SQLSTATE 22P02)
// when the claim's transaction-local marker idem.locked is gone.
func isTxEnded(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InvalidTextRepresentation
}

func keyLostError(err error) error {
	return fmt.Errorf("%w (nothing committed): %w", ErrKeyLost, err)
}

// claimError says what a failed claim means and, where the schema is at
// fault, what to do.
func claimError(c *call, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerrcode.UndefinedTable:
			return fmt.Errorf("idem: the key table %s does not exist: %s before the first call: %w", c.s.table, applySchema, err)
		case pgerrcode.UndefinedColumn, pgerrcode.UndefinedFunction, pgerrcode.DatatypeMismatch:
			return fmt.Errorf("idem: the key table %s does not have the expected columns: apply the schema again with schema.ApplyTable (safe to repeat): %w", c.s.table, err)
		}
	}
	return fmt.Errorf("idem: claim key: %w", err)
}

// idleError names the setting that ended the call's transaction when the
// server ended its session for sitting idle in it (SQLSTATE 25P03), which
// pgx reports as a bare FATAL: fn paused between statements (an external
// call, most often) past Config.IdleTimeout, or past the outer
// transaction's own idle_in_transaction_session_timeout when outer. err
// stays wrapped, so errors.Is, errors.As and Retryable see what they saw.
func idleError(c *call, outer bool, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.IdleInTransactionSessionTimeout {
		return err
	}
	limit := "the server's idle_in_transaction_session_timeout (Config.IdleTimeout is negative: idem sets none)"
	switch {
	case outer:
		limit = "the outer transaction's idle_in_transaction_session_timeout (Config.IdleTimeout does not apply to a call on an outer transaction)"
	case c.s.idle != nil:
		ms, _ := strconv.ParseInt(c.s.idle[0].(string), 10, 64)
		limit = fmt.Sprintf("Config.IdleTimeout (%v)", time.Duration(ms)*time.Millisecond)
	}
	return fmt.Errorf("idem: the server ended the call's transaction, which sent no statement for longer than %s; "+
		"everything rolled back and the key is free. Work that waits outside the database (a call to another service) "+
		"belongs in an idem.Operation, whose external steps hold no transaction open, or raise the timeout above fn's longest pause: %w", limit, err)
}

// isUniqueViolation reports SQLSTATE 23505: the deferred protocol's insert
// of the key's row met a row that was written outside the protocol.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation
}
