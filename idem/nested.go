package idem

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/dbtx"
)

// nested runs the protocol through db.Begin, for an outer pgx.Tx (a
// savepoint) or any other Beginner. It costs BEGIN and COMMIT their own round
// trips; the claim still travels with the savepoint that isolates fn's
// writes from a refusal.
type nested struct {
	db  Beginner
	txn pgx.Tx
}

// txBeginner is implemented by pools and connections that take options.
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

func (n *nested) outer() bool {
	_, ok := n.db.(pgx.Tx)
	return ok
}

func (n *nested) claim(ctx context.Context, c *call) (claim, error) {
	var err error
	if tb, ok := n.db.(txBeginner); ok && !n.outer() && c.s.txOpts != (pgx.TxOptions{}) {
		n.txn, err = tb.BeginTx(ctx, c.s.txOpts)
	} else {
		n.txn, err = n.db.Begin(ctx)
	}
	if err != nil {
		return claim{}, fmt.Errorf("begin: %w", err)
	}
	b := &pgx.Batch{}
	b.Queue(c.stmts.claim, c.claimArgs()...)
	// Config.IdleTimeout, for a transaction this call began. An outer
	// transaction is the caller's: a local setting made in its savepoint
	// would outlive the savepoint and govern the rest of it.
	if c.s.idle != nil && !n.outer() {
		b.Queue(setIdleTimeoutSQL, c.s.idle...)
	}
	b.Queue("savepoint idem_work")
	br := n.txn.SendBatch(ctx, b)
	cl, claimErr := c.scanClaim(br.QueryRow())
	closeErr := br.Close()
	if claimErr != nil {
		return claim{}, claimErr
	}
	if closeErr != nil {
		return claim{}, closeErr
	}
	return cl, nil
}

func (n *nested) tx() pgx.Tx { return dbtx.Owned{Tx: n.txn} }

func (n *nested) closeTx() {}

func (n *nested) finish(ctx context.Context, c *call, fin *finish) error {
	b := &pgx.Batch{}
	if fin.refused {
		b.Queue("rollback to savepoint idem_work")
	}
	complete := b.Len()
	b.Queue(c.stmts.complete, c.scope, c.key, fin.status, fin.response, fin.refusal)
	if failed, err := execAll(n.txn.SendBatch(ctx, b), b.Len()); err != nil {
		if failed == complete && isKeyLost(err) {
			return keyLostError(err)
		}
		return fmt.Errorf("idem: store result: %w", err)
	}
	if err := n.txn.Commit(ctx); err != nil {
		return commitError(err, !n.outer())
	}
	return nil
}

func (n *nested) abort(ctx context.Context) {
	if n.txn != nil {
		dbtx.Rollback(ctx, n.txn)
	}
}

// reader is the outer transaction, or db itself, to read a late-committed
// row through once the attempt's transaction is gone.
func (n *nested) reader() querier {
	if q, ok := n.db.(querier); ok {
		return q
	}
	return closedQuerier{}
}

type closedQuerier struct{}

func (closedQuerier) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{} }

type errRow struct{}

func (errRow) Scan(...any) error { return pgx.ErrNoRows }
