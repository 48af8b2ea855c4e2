package payments

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/schema"
)

//go:embed sql/schema.sql
var schemaSQL string

// ErrOldSchema means the database holds the accounts and payments tables
// of an earlier version of the example, with sequential ids. Migrate
// changes nothing then: drop those tables (and their idempotency keys,
// whose scopes name the old ids), or use another database. Retrying does
// not help.
var ErrOldSchema = errors.New("payments: the database holds tables of an earlier version, with sequential ids")

// Migrate creates the idempotency table (schema.Apply) and the accounts and
// payments tables if they are missing. It is safe to run on every start.
// It returns ErrOldSchema for tables of an earlier version.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := schema.Apply(ctx, pool); err != nil {
		return err
	}
	// One multi-statement string runs as one implicit transaction; the lock
	// keeps two processes starting at once from racing on CREATE TABLE IF
	// NOT EXISTS, which is not concurrency-safe.
	_, err := pool.Exec(ctx, "SELECT pg_advisory_xact_lock(7306086, hashtext('payments example schema'));\n"+schemaSQL)
	// sql/schema.sql raises object_not_in_prerequisite_state for the old
	// layout, before it changes anything.
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == pgerrcode.ObjectNotInPrerequisiteState {
		return fmt.Errorf("%w (%s; %s)", ErrOldSchema, pgErr.Message, pgErr.Hint)
	}
	if err != nil {
		return fmt.Errorf("payments: apply schema: %w", err)
	}
	return nil
}
