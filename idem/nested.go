package idem

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/dbtx"
)

// nested is the transport through db.Begin, for an outer pgx.Tx (a
// savepoint) or any other Beginner. It costs BEGIN and COMMIT their own round
// trips; the claim still travels with the savepoint that isolates fn's
// writes from a refusal. Its protocol is insertProtocol, or
// partitionedProtocol on a partitioned table (chooseProtocol).
type nested struct {
	db    Beginner
	txn   pgx.Tx
	fnTx  guardedTx
	close func()
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
	tb, canOpt := n.db.(txBeginner)
	withOpts := !n.outer() && c.s.txOpts != (pgx.TxOptions{})
	if withOpts && canOpt {
		n.txn, err = tb.BeginTx(ctx, c.s.txOpts)
	} else {
		n.txn, err = n.db.Begin(ctx)
		if err == nil && withOpts {
			// No BeginTx: set the modes before the first query instead.
			_, err = n.txn.Exec(ctx, "set transaction"+strings.TrimPrefix(c.begin, "begin"))
		}
	}
	if err != nil {
		return claim{}, fmt.Errorf("begin: %w", err)
	}
	stmts, err := resolveQuerier(ctx, n.txn, c.s.stmts)
	if err != nil {
		return claim{}, err
	}
	proto, err := chooseProtocol(c, stmts, false, c.s.txOpts.IsoLevel)
	if err != nil {
		return claim{}, err
	}
	c.stmts, c.proto = stmts, proto
	b := &pgx.Batch{}
	// Config.IdleTimeout, for a transaction this call began. An outer
	// transaction is the caller's: a local setting made in its savepoint
	// would outlive the savepoint and govern the rest of it.
	var idle []any
	if !n.outer() {
		idle = c.s.idle
	}
	proto.queueClaim(b, c, idle, true)
	b.Queue("savepoint idem_work")
	br := n.txn.SendBatch(ctx, b)
	cl, claimErr := proto.readClaim(br, c, true)
	closeErr := br.Close()
	switch {
	case claimErr != nil:
		return claim{}, claimErr
	case !cl.claimed:
		return cl, nil // abort rolls back whatever the claim did
	case closeErr != nil:
		return claim{}, closeErr
	}
	return cl, nil
}

// tx is the guarded transaction handed to fn, made on first use.
func (n *nested) tx() pgx.Tx {
	if n.close == nil {
		n.fnTx, n.close = newGuardedTx(n.txn)
	}
	return n.fnTx
}

func (n *nested) closeTx() {
	if n.close != nil {
		n.close()
	}
}

func (n *nested) finish(ctx context.Context, c *call, fin *finish) error {
	b := &pgx.Batch{}
	complete := queueFinish(b, c, fin)
	if failed, err := execAll(n.txn.SendBatch(ctx, b), b.Len()); err != nil {
		if failed == complete {
			if kerr := c.proto.completeError(err); kerr != nil {
				return kerr
			}
		}
		return fmt.Errorf("idem: store result: %w", err)
	}
	if err := n.txn.Commit(ctx); err != nil {
		return commitError(err, !n.outer())
	}
	return nil
}

func (n *nested) ended() bool {
	conn := n.txn.Conn()
	return conn != nil && !conn.IsClosed() && conn.PgConn().TxStatus() == 'I'
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
