package dbtx

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

// An Execer runs a statement: *pgxpool.Pool, *pgx.Conn and pgx.Tx all do.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}
