package dbtx

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// CommitOutcomeUnknown reports whether err, returned by a COMMIT the caller
// sent, leaves the outcome unknown: the request may have reached the server
// and its answer been lost. A server error, a COMMIT the server turned into
// a rollback, or a request that never left means nothing committed.
func CommitOutcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return err != nil && !errors.As(err, &pgErr) && !errors.Is(err, pgx.ErrTxCommitRollback) && !pgconn.SafeToRetry(err)
}
