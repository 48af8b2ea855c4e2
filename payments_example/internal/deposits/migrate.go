package deposits

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed sql/schema.sql
var schemaSQL string

// Migrate creates the deposits table if it is missing. It is safe to run
// on every start; payments.Migrate must have run first (the table refers
// to accounts).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	// One multi-statement string runs as one implicit transaction; the lock
	// keeps two processes starting at once from racing on CREATE TABLE IF
	// NOT EXISTS, which is not concurrency-safe.
	_, err := pool.Exec(ctx, "SELECT pg_advisory_xact_lock(7306086, hashtext('payments example deposits'));\n"+schemaSQL)
	if err != nil {
		return fmt.Errorf("deposits: apply schema: %w", err)
	}
	return nil
}
