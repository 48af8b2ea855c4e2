package idem

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// guardedTx is the transaction handed to fn on the path through Begin (an
// outer transaction or any other Beginner): ending it belongs to Do, and
// once fn has returned it refuses every use, as the pipelined path's connTx
// does, so work that outlives fn (a goroutine it started) cannot write
// between fn's return and COMMIT. Savepoints begun in it share its fate.
type guardedTx struct {
	tx     pgx.Tx
	closed *atomic.Bool
	owned  bool // the transaction Do ends, rather than a savepoint of fn's
}

var _ pgx.Tx = guardedTx{}

func newGuardedTx(tx pgx.Tx) (guardedTx, func()) {
	closed := new(atomic.Bool)
	return guardedTx{tx: tx, closed: closed, owned: true}, func() { closed.Store(true) }
}

// Begin starts a savepoint.
func (g guardedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if g.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	child, err := g.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return guardedTx{tx: child, closed: g.closed}, nil
}

// Commit returns ErrTxOwned for the transaction Do owns, and releases a
// savepoint of fn's.
func (g guardedTx) Commit(ctx context.Context) error {
	if err := g.endable(); err != nil {
		return err
	}
	return g.tx.Commit(ctx)
}

// Rollback returns ErrTxOwned for the transaction Do owns, and rolls back a
// savepoint of fn's.
func (g guardedTx) Rollback(ctx context.Context) error {
	if err := g.endable(); err != nil {
		return err
	}
	return g.tx.Rollback(ctx)
}

// endable is why fn may not end g, or nil: Do owns the transaction, or the
// call is over.
func (g guardedTx) endable() error {
	switch {
	case g.owned:
		return ErrTxOwned
	case g.closed.Load():
		return pgx.ErrTxClosed
	}
	return nil
}

// CopyFrom runs COPY FROM in the transaction.
func (g guardedTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if g.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return g.tx.CopyFrom(ctx, table, cols, src)
}

// SendBatch sends a batch in the transaction.
func (g guardedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if g.closed.Load() {
		return closedBatch{}
	}
	return g.tx.SendBatch(ctx, b)
}

// LargeObjects returns the large object API of the transaction.
func (g guardedTx) LargeObjects() pgx.LargeObjects { return g.tx.LargeObjects() }

// Prepare prepares a statement.
func (g guardedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if g.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return g.tx.Prepare(ctx, name, sql)
}

// Exec runs a statement in the transaction.
func (g guardedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if g.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return g.tx.Exec(ctx, sql, args...)
}

// Query runs a query in the transaction.
func (g guardedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if g.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return g.tx.Query(ctx, sql, args...)
}

// QueryRow runs a query that returns at most one row in the transaction.
func (g guardedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if g.closed.Load() {
		return closedRow{}
	}
	return g.tx.QueryRow(ctx, sql, args...)
}

// Conn returns the connection the transaction runs on.
func (g guardedTx) Conn() *pgx.Conn { return g.tx.Conn() }
