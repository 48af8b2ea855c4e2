package idem

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// txBeginner is implemented by pools and connections that take options.
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// onBeginner runs the protocol through db.Begin, for an outer pgx.Tx (a
// savepoint) or any other Beginner. It costs BEGIN and COMMIT their own round
// trips; the claim still travels with the savepoint that isolates fn.
func onBeginner[T any](ctx context.Context, db Beginner, c *call, fn func(pgx.Tx) (T, error)) (T, error) {
	var zero T
	_, nested := db.(pgx.Tx)
	var (
		tx  pgx.Tx
		err error
	)
	if tb, ok := db.(txBeginner); ok && !nested && c.cfg.txOpts != (pgx.TxOptions{}) {
		tx, err = tb.BeginTx(ctx, c.cfg.txOpts)
	} else {
		tx, err = db.Begin(ctx)
	}
	if err != nil {
		return zero, fmt.Errorf("idem: begin: %w", err)
	}
	// Deferred so a panic in fn rolls back too; after Commit it is a no-op.
	defer rollbackTx(ctx, tx)

	b := &pgx.Batch{}
	b.Queue(c.stmts.claim, c.claimArgs()...)
	b.Queue("savepoint idem_work")
	br := tx.SendBatch(ctx, b)
	cl, claimErr := c.scanClaim(br.QueryRow())
	closeErr := br.Close()
	if claimErr != nil {
		return zero, fmt.Errorf("idem: claim key: %w", claimErr)
	}
	if closeErr != nil {
		return zero, fmt.Errorf("idem: claim key: %w", closeErr)
	}
	if !cl.claimed {
		rollbackTx(ctx, tx)
		return settle[T](ctx, readerOf(db), c, cl)
	}

	v, fnErr := fn(ownedTx{tx})
	fin, err := finishing(ctx, c, v, fnErr)
	if err != nil {
		return v, err
	}
	fb := &pgx.Batch{}
	if fin.refused {
		fb.Queue("rollback to savepoint idem_work")
	}
	fb.Queue(c.stmts.complete, c.cfg.scope, c.key, fin.status, fin.response, fin.refusal)
	if err := execAll(tx.SendBatch(ctx, fb), fb.Len()); err != nil {
		return v, fmt.Errorf("idem: store result: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return v, commitError(err, !nested)
	}
	return v, fnErr
}

// readerOf picks what to read a late-committed row through once the
// attempt's transaction is gone: the outer transaction, or db itself.
func readerOf(db Beginner) querier {
	if q, ok := db.(querier); ok {
		return q
	}
	return closedQuerier{}
}

type closedQuerier struct{}

func (closedQuerier) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{} }

type errRow struct{}

func (errRow) Scan(...any) error { return pgx.ErrNoRows }

func rollbackTx(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	// ErrTxClosed after Commit is expected; on any other failure pgx closes
	// the connection, and the server rolls back with it.
	_ = tx.Rollback(ctx)
}

// ownedTx is the transaction handed to fn on the generic path: everything
// passes through except ending it, which belongs to Do.
type ownedTx struct{ pgx.Tx }

// Commit returns ErrTxOwned: Do commits.
func (ownedTx) Commit(context.Context) error { return ErrTxOwned }

// Rollback returns ErrTxOwned: return an error from fn to roll back.
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }
