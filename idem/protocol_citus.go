package idem

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// citusProtocol is the protocol on a database with the Citus extension,
// where the key table is distributed by scope (schema.ApplyDistributed),
// on every transport and at every isolation level (chooseProtocol). Each
// statement names one shard, by scope = $1, so that Citus routes it whole
// to the node holding the key's shard, and a call whose fn stays in the
// same tenant is a single-shard transaction: one worker, one COMMIT, no
// two-phase commit.
//
//	round trip 1: BEGIN; claim_citus; insert_citus; [idle timeout;] SAVEPOINT idem_work
//	last round trip: [ROLLBACK TO SAVEPOINT idem_work;] complete_citus; COMMIT
//
// Unlike the other protocols, the claim runs after BEGIN: Citus commits
// each statement of an implicit transaction on its worker as it ends, so
// neither a lock nor a row of the claim would survive to BEGIN. A replay,
// a key in progress and a lost race therefore leave a transaction open
// that costs a ROLLBACK round trip.
//
// What excludes a duplicate: claim_citus.sql takes the key's advisory lock
// on the shard's node (Citus routes the SELECT there, functions included),
// so two calls entering through different nodes meet on one lock, and the
// second answers ErrInProgress at once. insert_citus.sql then inserts the
// key's row in the same transaction: the shard's primary key refuses any
// second row of the key, lock or no lock.
type citusProtocol struct{ stmts *statements }

func (p citusProtocol) queueClaim(b *pgx.Batch, c *call, idle []any, _ bool) {
	b.Queue(p.stmts.citus.claim, c.scopeArg, c.keyArg, c.lockArg)
	b.Queue(p.stmts.citus.next, c.scopeArg, c.keyArg, c.claimArgv[2], c.claimArgv[3])
	if idle != nil {
		b.Queue(setIdleTimeoutSQL, idle...)
	}
}

func (p citusProtocol) readClaim(br pgx.BatchResults, c *call, _ bool) (claim, error) {
	t := &c.scan
	*t = claimTargets{}
	err := br.QueryRow().Scan(&t.locked, &t.hash, &t.status, &t.response, &t.refusal)
	switch {
	case isDivisionByZero(err):
		// The lock is held by another transaction: the key is in progress.
		no := false
		return claim{locked: &no}, nil
	case err != nil:
		return claim{}, err
	}
	if t.locked == nil {
		// A live row: insert_citus.sql left it as it was.
		t.claimed = false
		cl := t.claim()
		return cl, nil
	}
	t.hash, t.status, t.response, t.refusal = nil, nil, nil, nil
	tag, err := br.Exec()
	if err != nil {
		return claim{}, fmt.Errorf("idem: claim key: %w", err)
	}
	t.claimed = tag.RowsAffected() == 1
	cl := t.claim()
	if !cl.claimed {
		// A first attempt committed between the claim's snapshot and its
		// lock: the lookup after this attempt replays its row.
		cl.lostRace()
	}
	return cl, nil
}

func (p citusProtocol) queueComplete(b *pgx.Batch, c *call, fin *finish) {
	b.Queue(p.stmts.citus.complete, c.scopeArg, c.keyArg, statusArg(fin.status), fin.response, fin.refusal)
}

// completeError: the update found no row of the key in progress (22012),
// or the marker is gone (22P02).
func (citusProtocol) completeError(err error) error {
	return insertProtocol{}.completeError(err)
}

func (p citusProtocol) firstTrip() []string {
	return []string{p.stmts.citus.claim, p.stmts.citus.next, setIdleTimeoutSQL}
}

// claimsInTx: see the type's comment.
func (citusProtocol) claimsInTx() bool { return true }
