package integration_test

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/schema"
)

func applyTable(ctx context.Context, pool *pgxpool.Pool, table string) error {
	return schema.ApplyTable(ctx, pool, table)
}
