package idem

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// connTx is the pgx.Tx that Do hands to fn on a pool or connection. pgx's own
// transaction types cannot adopt a transaction that BEGIN opened inside a
// pipeline, so Do carries its own: queries go straight to the connection,
// nested Begin makes savepoints, and ending the transaction belongs to Do.
type connTx struct {
	conn   *pgx.Conn
	closed atomicBool
	spNum  int64
	lo     pgx.Tx
}

// atomicBool is the closed flag: set when fn returns, read by whatever fn
// left running, so it must not race.
type atomicBool = atomic.Bool

var _ pgx.Tx = (*connTx)(nil)

// Begin starts a pseudo-nested transaction on a savepoint.
func (t *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	t.spNum++
	name := "idem_sp_" + strconv.FormatInt(t.spNum, 10)
	if _, err := t.conn.Exec(ctx, "savepoint "+name); err != nil {
		return nil, err
	}
	return &savepointTx{parent: t, name: name}, nil
}

// Commit returns ErrTxOwned: Do commits when fn returns.
func (t *connTx) Commit(context.Context) error { return ErrTxOwned }

// Rollback returns ErrTxOwned: return an error from fn to roll back.
func (t *connTx) Rollback(context.Context) error { return ErrTxOwned }

// CopyFrom runs COPY FROM in the transaction.
func (t *connTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return t.conn.CopyFrom(ctx, table, cols, src)
}

// SendBatch sends a batch in the transaction.
func (t *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed.Load() {
		return closedBatch{}
	}
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects returns the large object API of the transaction. pgx binds
// it to a transaction of its own type, so the first call adopts the open
// transaction as one (a BEGIN the server answers with a warning).
func (t *connTx) LargeObjects() pgx.LargeObjects {
	if t.lo == nil && !t.closed.Load() {
		if tx, err := t.conn.Begin(context.Background()); err == nil {
			t.lo = tx
		}
	}
	if t.lo == nil {
		return pgx.LargeObjects{}
	}
	return t.lo.LargeObjects()
}

// Prepare prepares a statement on the connection.
func (t *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Prepare(ctx, name, sql)
}

// Exec runs a statement in the transaction.
func (t *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.conn.Exec(ctx, sql, args...)
}

// Query runs a query in the transaction.
func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Query(ctx, sql, args...)
}

// QueryRow runs a query that returns at most one row in the transaction.
func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed.Load() {
		return closedRow{}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

// Conn returns the connection the transaction runs on.
func (t *connTx) Conn() *pgx.Conn { return t.conn }

// savepointTx is a pseudo-nested transaction inside a connTx.
type savepointTx struct {
	parent *connTx
	name   string
	closed bool
}

var _ pgx.Tx = (*savepointTx)(nil)

func (s *savepointTx) live() bool { return !s.closed && !s.parent.closed.Load() }

// Begin starts a further nested savepoint.
func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if !s.live() {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Begin(ctx)
}

// Commit releases the savepoint.
func (s *savepointTx) Commit(ctx context.Context) error {
	return s.end(ctx, "release savepoint ")
}

// Rollback rolls back to the savepoint.
func (s *savepointTx) Rollback(ctx context.Context) error {
	return s.end(ctx, "rollback to savepoint ")
}

// end closes the savepoint with verb, once.
func (s *savepointTx) end(ctx context.Context, verb string) error {
	if !s.live() {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.parent.conn.Exec(ctx, verb+s.name)
	return err
}

// CopyFrom runs COPY FROM in the savepoint.
func (s *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if !s.live() {
		return 0, pgx.ErrTxClosed
	}
	return s.parent.CopyFrom(ctx, table, cols, src)
}

// SendBatch sends a batch in the savepoint.
func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !s.live() {
		return closedBatch{}
	}
	return s.parent.SendBatch(ctx, b)
}

// LargeObjects returns the large object API of the enclosing transaction.
func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.parent.LargeObjects() }

// Prepare prepares a statement on the connection.
func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if !s.live() {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Prepare(ctx, name, sql)
}

// Exec runs a statement in the savepoint.
func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !s.live() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return s.parent.Exec(ctx, sql, args...)
}

// Query runs a query in the savepoint.
func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !s.live() {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Query(ctx, sql, args...)
}

// QueryRow runs a query that returns at most one row in the savepoint.
func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !s.live() {
		return closedRow{}
	}
	return s.parent.QueryRow(ctx, sql, args...)
}

// Conn returns the connection the savepoint runs on.
func (s *savepointTx) Conn() *pgx.Conn { return s.parent.conn }

type closedRow struct{}

func (closedRow) Scan(...any) error { return pgx.ErrTxClosed }

type closedBatch struct{}

func (closedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (closedBatch) Query() (pgx.Rows, error)         { return nil, pgx.ErrTxClosed }
func (closedBatch) QueryRow() pgx.Row                { return closedRow{} }
func (closedBatch) Close() error                     { return pgx.ErrTxClosed }
func (closedBatch) Tx() pgx.Tx                       { return nil }
