package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/protocolswitch"
)

// pipeline runs the protocol on a connection outside a transaction, in as
// few round trips as the bare transaction. On a plain key table at READ
// COMMITTED (the default) it runs the deferred protocol:
//
//	round trip 1: [SET modes;] claim_deferred; assert_deferred (and idle timeout); BEGIN; SAVEPOINT idem_work
//	fn's own round trips
//	last round trip: [ROLLBACK TO SAVEPOINT idem_work;] complete_deferred; COMMIT
//
// The claim reads the key's row and takes the key's advisory lock, and
// writes nothing; the key's row is inserted once, completed, before COMMIT.
// Inserting it in progress first and updating it at the end (as claim.sql
// and complete.sql do) costs the server a second write, and the claim a
// speculative insertion, for nothing that the lock does not already give:
// while the transaction holds the lock, no other call can claim the key.
// What the lock alone does not give, seeing a first attempt that committed
// between the claim's snapshot and the lock, assert_deferred.sql's own
// snapshot does, at READ COMMITTED only. At REPEATABLE READ and
// SERIALIZABLE, whether asked for with WithTxOptions or a session default,
// the claim inserts the row in progress (claim.sql), since a unique
// violation is then the only thing that can see that first attempt, and the
// completion updates it; so does the partitioned layout (claim_partitioned.sql).
//
// The claim runs in the implicit transaction that the extended protocol
// opens for the pipeline; BEGIN turns it into an explicit one that keeps the
// claim. When the key is not claimed, the assertion fails first, the server
// skips the rest up to Sync and rolls the implicit transaction back: the
// replay costs this one round trip and leaves the connection idle.
// WithTxOptions' modes are set by the SET statements that lead the pipeline
// (setTxSQL), so this holds at every isolation level.
//
// On a partitioned table assert_claimed also takes the second look that
// keeps a live key unique across partitions; a claim it undoes costs the
// lookup round trip of a lost race (claim_partitioned.sql). The first call
// per connection and table asks the catalog which layout the table has.
type pipeline struct {
	conn   *pgx.Conn
	owned  *connTx
	first  pgx.Batch
	firstQ [7]*pgx.QueuedQuery
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
	iso := c.s.txOpts.IsoLevel
	if stmts.isPartitioned && iso == pgx.RepeatableRead {
		return claim{}, errRepeatableRead(c)
	}
	// The deferred protocol needs READ COMMITTED: asked for, or the
	// session's default unless assert_deferred found otherwise before.
	switch iso {
	case "":
		c.deferred = !stmts.isPartitioned && !stateOf(conn).notReadCommitted
	case pgx.ReadCommitted, pgx.ReadUncommitted:
		c.deferred = !stmts.isPartitioned
	default:
		c.deferred = false
	}
	if protocolswitch.EagerClaim.Load() {
		c.deferred = false
	}
	if err := prepareFirstTrip(ctx, conn, stmts, c.setTx); err != nil {
		return claim{}, fmt.Errorf("prepare: %w", err)
	}
	b := batch(&p.first, p.firstQ[:])
	for _, sql := range c.setTx {
		b.Queue(sql)
	}
	// Config.IdleTimeout: a local setting, so that it lives exactly as long
	// as the call's transaction and costs no round trip of its own: set by
	// assert_deferred on a claim, or by a statement after BEGIN. A replay
	// never keeps it: the assertion fails before it. The server arms the
	// timer with it at this pipeline's ReadyForQuery.
	if c.deferred {
		var idle any
		if c.s.idle != nil {
			idle = c.s.idle[0]
		}
		b.Queue(stmts.claimDeferred, c.scopeArg, c.keyArg)
		b.Queue(stmts.assertDeferred, c.scopeArg, c.keyArg, idle)
		b.Queue("begin")
	} else {
		b.Queue(stmts.claim, c.claimArgs()...)
		b.Queue(stmts.assertClaimed, c.scopeArg, c.keyArg)
		b.Queue("begin")
		if c.s.idle != nil {
			b.Queue(setIdleTimeoutSQL, c.s.idle...)
		}
	}
	b.Queue("savepoint idem_work")

	br := conn.SendBatch(ctx, b)
	var setErr error
	for range c.setTx {
		if _, err := br.Exec(); err != nil && setErr == nil {
			setErr = err
		}
	}
	var cl claim
	claimErr := setErr
	if claimErr == nil {
		cl, claimErr = c.scanClaim(br.QueryRow())
	}
	// The deferred protocol and the partitioned layout read the assertion's
	// verdict: its failure after a claim is a lost race, -1 an isolation
	// level it cannot serve.
	checked := c.deferred || stmts.isPartitioned
	verdict, assertErr := int32(0), error(nil)
	if checked && claimErr == nil {
		assertErr = br.QueryRow().Scan(&verdict)
	}
	closeErr := br.Close()
	switch {
	case setErr != nil:
		return claim{}, fmt.Errorf("set transaction modes: %w", setErr)
	case claimErr != nil:
		return claim{}, claimErr
	case c.deferred && assertErr == nil && verdict == -1 && iso == "":
		// The session's transactions are not READ COMMITTED: claim again
		// with claim.sql, and do so from now on on this connection.
		rollbackConn(ctx, conn)
		if conn.PgConn().TxStatus() != 'I' {
			return claim{}, errors.New("idem: could not roll back a claim on a session that is not READ COMMITTED")
		}
		stateOf(conn).notReadCommitted = true
		return p.claim(ctx, c)
	case c.deferred && assertErr == nil && verdict == -1:
		return claim{}, fmt.Errorf("idem: the transaction is not READ COMMITTED although WithTxOptions asked for %s (does something between idem and PostgreSQL drop SET statements?)", iso)
	case c.deferred && assertErr == nil && verdict == -2:
		return claim{}, fmt.Errorf("idem: claim key: the key table %s cannot be written in this transaction (a read-only transaction, on a standby or by default_transaction_read_only, or no INSERT privilege on the table); fn did not run", c.s.table)
	case stmts.isPartitioned && assertErr == nil && verdict < 0:
		return claim{}, errRepeatableRead(c) // the caller rolls back
	case !cl.claimed:
		// The assertion failed on purpose; closeErr is that failure.
		return cl, nil
	case checked && isDivisionByZero(assertErr):
		cl.lostRace()
		return cl, nil
	case c.deferred && assertErr == nil && verdict != 1 && verdict != 2:
		return claim{}, fmt.Errorf("idem: claim key: unexpected verdict %d from the claim's assertion", verdict)
	case assertErr != nil:
		return claim{}, fmt.Errorf("begin: %w", assertErr)
	case closeErr != nil:
		return claim{}, fmt.Errorf("begin: %w", closeErr)
	}
	c.present = c.deferred && verdict == 2
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
	if c.deferred {
		c.queueCompleteDeferred(b, fin)
	} else {
		c.queueComplete(b, fin)
	}
	b.Queue("commit")
	failed, err := execAll(p.conn.SendBatch(ctx, b), b.Len())
	return lastTripError(failed, complete, b.Len()-1, err, c.deferred)
}

func (p *pipeline) abort(ctx context.Context) { rollbackConn(ctx, p.conn) }

func (p *pipeline) ended() bool {
	return !p.conn.IsClosed() && p.conn.PgConn().TxStatus() == 'I'
}

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
