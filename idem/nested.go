package idem

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/dbtx"
)

// nested is the transport for an outer pgx.Tx or any other Beginner. In an
// outer transaction the call is the savepoint idem_call: it is opened in
// the pipeline that carries the claim and released in the one that carries
// the completion, so the call costs the round trips of its statements and
// no more. Through any other Beginner, BEGIN and COMMIT take their own round
// trips. Either way the claim travels with the savepoint idem_work that
// isolates fn's writes from a refusal. Its protocol is insertProtocol, or
// partitionedProtocol on a partitioned table (chooseProtocol).
type nested struct {
	db    Beginner
	txn   pgx.Tx // the outer transaction itself, or the one this call began
	fnTx  guardedTx
	close func()
	// inCall is set once the savepoint idem_call is open in the outer
	// transaction, until it is released or rolled back to.
	inCall bool
}

// The savepoint that is one call in an outer transaction. Calls nest in
// the order they run (a call inside another's fn), and RELEASE and ROLLBACK
// TO name the newest savepoint of a name, so one name serves every depth.
const (
	savepointCallSQL = "savepoint idem_call"
	releaseCallSQL   = "release savepoint idem_call"
	undoCallSQL      = "rollback to savepoint idem_call; release savepoint idem_call"
)

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
	if outer, ok := n.db.(pgx.Tx); ok {
		n.txn = outer // the call's work is the savepoint idem_call in it
	} else if withOpts && canOpt {
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
	if n.outer() {
		b.Queue(savepointCallSQL)
	}
	proto.queueClaim(b, c, idle, true)
	b.Queue("savepoint idem_work")
	br := n.txn.SendBatch(ctx, b)
	if n.outer() {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return claim{}, fmt.Errorf("savepoint: %w", err)
		}
		n.inCall = true
	}
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
	if n.outer() {
		b.Queue(releaseCallSQL)
	}
	if failed, err := execAll(n.txn.SendBatch(ctx, b), b.Len()); err != nil {
		if failed == complete {
			if kerr := c.proto.completeError(err); kerr != nil {
				return kerr
			}
		}
		return fmt.Errorf("idem: store result: %w", err)
	}
	if n.outer() {
		// Released: the key and fn's writes are the outer transaction's
		// now, and commit when it does.
		n.inCall = false
		return nil
	}
	if err := n.txn.Commit(ctx); err != nil {
		return commitError(err, true)
	}
	return nil
}

func (n *nested) ended() bool {
	conn := n.txn.Conn()
	return conn != nil && !conn.IsClosed() && conn.PgConn().TxStatus() == 'I'
}

func (n *nested) abort(ctx context.Context) {
	switch {
	case n.outer():
		if n.inCall {
			// Undo the call and leave the outer transaction as it was
			// before it, usable by the caller.
			n.inCall = false
			cctx, cancel := cleanupContext(ctx)
			defer cancel()
			_, _ = n.txn.Exec(cctx, undoCallSQL)
		}
	case n.txn != nil:
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
