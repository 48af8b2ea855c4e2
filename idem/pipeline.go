package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// pipeline runs the protocol on a connection outside a transaction, in as
// few round trips as the bare transaction:
//
//	round trip 1: claim; assert_claimed; BEGIN; set idle timeout; SAVEPOINT idem_work
//	fn's own round trips
//	last round trip: [ROLLBACK TO SAVEPOINT idem_work;] complete; COMMIT
//
// The claim runs in the implicit transaction that the extended protocol
// opens for the pipeline; BEGIN turns it into an explicit one that keeps the
// claim. When the key is not claimed, assert_claimed fails first, the server
// skips the rest up to Sync and rolls the implicit transaction back: the
// replay costs this one round trip and leaves the connection idle.
//
// On a partitioned table assert_claimed also takes the second look that
// keeps a live key unique across partitions; a claim it undoes costs the
// lookup round trip of a lost race (claim_partitioned.sql). The first call
// per connection and table asks the catalog which layout the table has.
type pipeline struct {
	conn   *pgx.Conn
	owned  *connTx
	first  pgx.Batch
	firstQ [5]*pgx.QueuedQuery
	last   pgx.Batch
	lastQ  [3]*pgx.QueuedQuery
}

// batch empties b and gives it room for the statements of one pipeline.
func batch(b *pgx.Batch, room []*pgx.QueuedQuery) *pgx.Batch {
	*b = pgx.Batch{QueuedQueries: room[:0]}
	return b
}

func (p *pipeline) claim(ctx context.Context, c *call) (claim, error) {
	conn := p.conn
	if conn.PgConn().TxStatus() != 'I' {
		return claim{}, errors.New("idem: the connection is inside a transaction; pass that pgx.Tx to Do instead")
	}
	stmts, err := resolveLayout(ctx, conn, c.s.stmts)
	if err != nil {
		return claim{}, err
	}
	c.stmts = stmts
	if stmts.isPartitioned && c.s.txOpts.IsoLevel == pgx.RepeatableRead {
		return claim{}, errRepeatableRead(c)
	}
	// A non-default isolation level must be set before the first snapshot,
	// so BEGIN goes first and a replay pays a ROLLBACK round trip.
	claimFirst := c.begin == "begin"
	if claimFirst {
		if err := prepareFirstTrip(ctx, conn, stmts); err != nil {
			return claim{}, fmt.Errorf("prepare: %w", err)
		}
	}
	b := batch(&p.first, p.firstQ[:])
	if claimFirst {
		b.Queue(stmts.claim, c.claimArgs()...)
		b.Queue(stmts.assertClaimed, c.scopeArg, c.keyArg)
		b.Queue("begin")
	} else {
		b.Queue(c.begin)
		b.Queue(stmts.claim, c.claimArgs()...)
		if stmts.isPartitioned {
			b.Queue(stmts.assertClaimed, c.scopeArg, c.keyArg)
		}
	}
	// Config.IdleTimeout: a local setting after BEGIN, so that it lives
	// exactly as long as the call's transaction and costs no round trip of
	// its own. A replay never keeps it: assert_claimed fails before it, or,
	// with BEGIN first, the replay's ROLLBACK undoes it. The server arms the
	// timer with it at this pipeline's ReadyForQuery.
	if c.s.idle != nil {
		b.Queue(setIdleTimeoutSQL, c.s.idle...)
	}
	b.Queue("savepoint idem_work")

	br := conn.SendBatch(ctx, b)
	var beginErr error
	if !claimFirst {
		_, beginErr = br.Exec()
	}
	cl, claimErr := c.scanClaim(br.QueryRow())
	// The partitioned layout reads assert_claimed's verdict: its failure
	// after a claim is a lost race, -1 a refused isolation level.
	verdict, assertErr := int32(0), error(nil)
	if stmts.isPartitioned && claimErr == nil && beginErr == nil {
		assertErr = br.QueryRow().Scan(&verdict)
	}
	closeErr := br.Close()
	switch {
	case beginErr != nil:
		return claim{}, fmt.Errorf("begin: %w", beginErr)
	case claimErr != nil:
		return claim{}, claimErr
	case stmts.isPartitioned && assertErr == nil && verdict < 0:
		return claim{}, errRepeatableRead(c) // the caller rolls back
	case !cl.claimed:
		// assert_claimed failed on purpose; closeErr is that failure.
		return cl, nil
	case stmts.isPartitioned && isDivisionByZero(assertErr):
		cl.lostRace()
		return cl, nil
	case assertErr != nil:
		return claim{}, fmt.Errorf("begin: %w", assertErr)
	case closeErr != nil:
		return claim{}, fmt.Errorf("begin: %w", closeErr)
	}
	p.owned = &connTx{conn: conn}
	return cl, nil
}

func (p *pipeline) tx() pgx.Tx { return p.owned }

func (p *pipeline) closeTx() {
	if p.owned != nil {
		p.owned.closed.Store(true)
	}
}

func (p *pipeline) finish(ctx context.Context, c *call, fin *finish) error {
	b := batch(&p.last, p.lastQ[:])
	if fin.refused {
		b.Queue("rollback to savepoint idem_work")
	}
	complete := b.Len()
	c.queueComplete(b, fin)
	b.Queue("commit")
	failed, err := execAll(p.conn.SendBatch(ctx, b), b.Len())
	switch {
	case err == nil:
		return nil
	case failed == complete && isKeyLost(err):
		return keyLostError(err)
	case failed < b.Len()-1 && isServerError(err):
		// The server refused a statement before COMMIT (a trigger on the key
		// table, say): the transaction aborted and nothing committed.
		return fmt.Errorf("idem: store result: %w", err)
	}
	return commitError(err, true)
}

func (p *pipeline) abort(ctx context.Context) { rollbackConn(ctx, p.conn) }

func (p *pipeline) reader() querier { return p.conn }

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
