package idem

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/dbtx"
)

// cleanupContext is ctx for a rollback: its values, not its cancellation.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return dbtx.CleanupContext(ctx)
}

// rollbackConn ends whatever transaction conn is in. A connection that
// cannot roll back is closed, which rolls back server-side.
func rollbackConn(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || (conn.PgConn().TxStatus() == 'I' && !conn.PgConn().IsBusy()) {
		return
	}
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	if _, err := conn.Exec(ctx, "rollback"); err != nil {
		_ = conn.Close(ctx)
	}
}
