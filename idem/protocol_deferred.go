package idem

import (
	_ "embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/sqltext"
)

// deferredProtocol claims a key without writing, and writes its row once,
// with the outcome, before COMMIT. It runs on a pipeline at READ COMMITTED
// with the plain table (chooseProtocol):
//
//	round trip 1: [SET modes;] claim_deferred; assert_deferred (and idle timeout); BEGIN; SAVEPOINT idem_work
//	fn's own round trips
//	last round trip: [ROLLBACK TO SAVEPOINT idem_work;] complete_deferred or complete_deferred_replace; COMMIT
//
// The claim reads the key's row and takes the key's advisory lock. Inserting
// the row 'in_progress' first and updating it at the end (insertProtocol)
// costs the server a second write, and the claim a speculative insertion,
// for nothing the lock does not already give: while the transaction holds
// the lock, no other call can claim the key. What the lock alone does not
// give, seeing a first attempt that committed between the claim's snapshot
// and the lock, assert_deferred.sql's own snapshot does, at READ COMMITTED
// only.
//
// The claim runs in the implicit transaction that the extended protocol
// opens for the pipeline; BEGIN turns it into an explicit one that keeps the
// claim. When the key is not claimed, the assertion fails first, the server
// skips the rest up to Sync and rolls the implicit transaction back: the
// replay costs this one round trip and leaves the connection idle.
type deferredProtocol struct{ stmts *statements }

var (
	//go:embed sql/claim_deferred.sql
	claimDeferredSQL string
	//go:embed sql/assert_deferred.sql
	assertDeferredSQL string
	//go:embed sql/complete_deferred.sql
	completeDeferredSQL string
	//go:embed sql/complete_deferred_replace.sql
	completeDeferredReplaceSQL string
)

// deferredSQL is deferredProtocol's statements for one table: the claim and
// its second look, and the completing insert, or upsert when the key has a
// row that is not live.
type deferredSQL struct {
	claim, assert, complete, completeReplace string
}

func newDeferredSQL(t sqltext.Table) deferredSQL {
	return deferredSQL{
		claim:           t.Rewrite(claimDeferredSQL),
		assert:          t.Rewrite(assertDeferredSQL),
		complete:        t.Rewrite(completeDeferredSQL),
		completeReplace: t.Rewrite(completeDeferredReplaceSQL),
	}
}

// errNotReadCommitted is assert_deferred.sql's verdict -1: the transaction
// is not READ COMMITTED although the protocol was chosen for it.
var errNotReadCommitted = errors.New("idem: the claim's transaction is not READ COMMITTED")

func (p deferredProtocol) queueClaim(b *pgx.Batch, c *call, idle []any, _ bool) {
	// The assertion sets the idle timeout itself, one statement fewer.
	var idleArg any
	if idle != nil {
		idleArg = idle[0]
	}
	b.Queue(p.stmts.deferred.claim, c.scopeArg, c.keyArg, c.lockArg)
	b.Queue(p.stmts.deferred.assert, c.scopeArg, c.keyArg, idleArg)
}

func (p deferredProtocol) readClaim(br pgx.BatchResults, c *call, _ bool) (claim, error) {
	t := &c.scan
	*t = claimTargets{}
	if err := br.QueryRow().Scan(&t.locked, &t.hash, &t.status, &t.response, &t.refusal); err != nil {
		return claim{}, err
	}
	// Holding the lock is a claim unless the assertion finds the race lost.
	t.claimed = t.locked != nil && *t.locked
	cl := t.claim()
	if !cl.claimed {
		return cl, nil // the assertion failed on purpose
	}
	var verdict int32
	err := br.QueryRow().Scan(&verdict)
	switch {
	case isDivisionByZero(err):
		cl.lostRace()
		return cl, nil
	case err != nil:
		return claim{}, fmt.Errorf("begin: %w", err)
	case verdict == 1, verdict == 2:
		c.replace = verdict == 2
		return cl, nil
	case verdict == -1:
		return claim{}, fmt.Errorf("%w (the session's default_transaction_isolation changed since idem first used this connection, or something between idem and PostgreSQL drops SET statements); fn did not run", errNotReadCommitted)
	case verdict == -2:
		return claim{}, fmt.Errorf("idem: claim key: the key table %s cannot be written in this transaction (a read-only transaction, on a standby or by default_transaction_read_only, or no INSERT privilege on the table); fn did not run", c.s.table)
	}
	return claim{}, fmt.Errorf("idem: claim key: unexpected verdict %d from the claim's assertion", verdict)
}

func (p deferredProtocol) queueComplete(b *pgx.Batch, c *call, fin *finish) {
	sql := p.stmts.deferred.complete
	if c.replace {
		sql = p.stmts.deferred.completeReplace
	}
	// The hash and the TTL are the claim's arguments, boxed once per call.
	b.Queue(sql, c.scopeArg, c.keyArg, c.claimArgv[2], statusArg(fin.status), fin.response, fin.refusal, c.claimArgv[3])
}

// completeError: the insertion met a row of the key that was written
// inside the call (23505), or the replacement matched nothing it may
// replace (22012).
func (deferredProtocol) completeError(err error) error {
	switch {
	case isTxEnded(err):
		return fmt.Errorf("%w: %w", ErrTxEnded, err)
	case isKeyLost(err) || isUniqueViolation(err):
		return keyLostError(err)
	}
	return nil
}

func (p deferredProtocol) firstTrip() []string {
	return []string{p.stmts.deferred.claim, p.stmts.deferred.assert}
}

func (deferredProtocol) claimsInTx() bool { return false }
