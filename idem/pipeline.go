package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// pipeline is the transport on a connection outside a transaction (a pool,
// a pool's connection, a pgx.Conn): the claim travels in one pipeline with
// BEGIN and the savepoint, and the completion in one with COMMIT, so an
// attempt costs the round trips of the bare transaction and a replay one
// round trip (see the protocols' files for each one's statements).
//
// WithTxOptions' modes are set by the SET statements that lead the pipeline
// (setTxSQL), before the claim's first snapshot, so that a replay's failing
// assertion leaves the connection idle at every isolation level. The first
// call per connection and table asks the catalog which layout the table has,
// and the session's default isolation level, which chooses the protocol
// when WithTxOptions does not.
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
	stmts, iso, err := resolveLayout(ctx, conn, c.s.stmts)
	if err != nil {
		return claim{}, err
	}
	if c.s.txOpts.IsoLevel != "" {
		iso = c.s.txOpts.IsoLevel
	}
	proto, err := chooseProtocol(c, stmts, true, iso)
	if err != nil {
		return claim{}, err
	}
	c.stmts, c.proto = stmts, proto
	// A protocol that claims inside the transaction opens it first, with
	// WithTxOptions' modes in BEGIN itself.
	inTx := proto.claimsInTx()
	setTx := c.setTx
	if inTx {
		setTx = nil
		if c.begin != "begin" {
			setTx = []string{c.begin}
		}
	}
	if err := prepareFirstTrip(ctx, conn, proto, setTx); err != nil {
		return claim{}, fmt.Errorf("prepare: %w", err)
	}
	b := batch(&p.first, p.firstQ[:])
	if inTx {
		b.Queue(c.begin)
	} else {
		for _, sql := range setTx {
			b.Queue(sql)
		}
	}
	// Config.IdleTimeout is a local setting, so that it lives exactly as
	// long as the call's transaction and costs no round trip of its own. A
	// replay never keeps it: the assertion fails before it. The server arms
	// the timer with it at this pipeline's ReadyForQuery.
	proto.queueClaim(b, c, c.s.idle, inTx)
	if !inTx {
		b.Queue("begin")
	}
	b.Queue("savepoint idem_work")

	br := conn.SendBatch(ctx, b)
	var setErr error
	if inTx {
		if _, err := br.Exec(); err != nil {
			setErr = err
		}
	} else {
		for range setTx {
			if _, err := br.Exec(); err != nil && setErr == nil {
				setErr = err
			}
		}
	}
	var cl claim
	claimErr := setErr
	if claimErr == nil {
		cl, claimErr = proto.readClaim(br, c, false)
	}
	closeErr := br.Close()
	switch {
	case setErr != nil && inTx:
		return claim{}, fmt.Errorf("begin: %w", setErr)
	case setErr != nil:
		return claim{}, fmt.Errorf("set transaction modes: %w", setErr)
	case errors.Is(claimErr, errNotReadCommitted):
		// The session's default changed: ask again on the next call.
		stateOf(conn).defaultIso = ""
		return claim{}, claimErr
	case claimErr != nil:
		return claim{}, claimErr
	case !cl.claimed:
		// The second look failed on purpose; closeErr is that failure.
		return cl, nil
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
	complete := queueFinish(b, c, fin)
	b.Queue("commit")
	failed, err := execAll(p.conn.SendBatch(ctx, b), b.Len())
	return lastTripError(c, failed, complete, b.Len()-1, err)
}

func (p *pipeline) abort(ctx context.Context) { rollbackConn(ctx, p.conn) }

func (p *pipeline) ended() bool {
	return !p.conn.IsClosed() && p.conn.PgConn().TxStatus() == 'I'
}

func (p *pipeline) reader() querier { return p.conn }

// execAll reads n results and reports the first failure and its index,
// including a COMMIT that the server turned into a rollback.
func execAll(br pgx.BatchResults, n int) (int, error) {
	failed, first := -1, error(nil)
	for i := 0; i < n; i++ {
		tag, err := br.Exec()
		if err != nil && first == nil {
			failed, first = i, err
		}
		if err == nil && i == n-1 && tag.String() == "ROLLBACK" && first == nil {
			failed, first = i, pgx.ErrTxCommitRollback
		}
	}
	if err := br.Close(); err != nil && first == nil {
		failed, first = n, err
	}
	return failed, first
}
