package dbtx

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// RollbackTimeout bounds the cleanup of a failed attempt.
const RollbackTimeout = 5 * time.Second

// CleanupContext returns ctx's values without its cancellation, bounded by
// RollbackTimeout: ctx ending may be the very reason to roll back, and the
// rollback must still reach the server.
func CleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), RollbackTimeout)
}

// Rollback rolls tx back with a cleanup context. pgx.ErrTxClosed after a
// commit is expected; on any other failure pgx closes the connection, and
// the server rolls back with it.
func Rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := CleanupContext(ctx)
	defer cancel()
	_ = tx.Rollback(ctx)
}
