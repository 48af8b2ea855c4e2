package payments

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/schema"
)

//go:embed sql/schema.sql
var schemaSQL string

// Migrate creates the idempotency table (schema.Apply) and the accounts and
// payments tables if they are missing. It is safe to run on every start.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := schema.Apply(ctx, pool); err != nil {
		return err
	}
	// One multi-statement string runs as one implicit transaction; the lock
	// keeps two processes starting at once from racing on CREATE TABLE IF
	// NOT EXISTS, which is not concurrency-safe.
	if _, err := pool.Exec(ctx, "SELECT pg_advisory_xact_lock(7306086, hashtext('payments example schema'));\n"+schemaSQL); err != nil {
		return fmt.Errorf("payments: apply schema: %w", err)
	}
	return nil
}
