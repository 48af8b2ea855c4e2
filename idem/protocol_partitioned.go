package idem

import (
	"github.com/jackc/pgx/v5"
)

// partitionedProtocol is insertProtocol for the partitioned layout
// (schema.ApplyPartitioned), on every transport. A key may have several rows
// there, an expired one awaiting its partition's drop and a new one, and no
// unique index spans the partitions, so the claim's second look,
// assert_claimed_partitioned.sql, is sent on every transport: at READ
// COMMITTED its snapshot, taken after the lock, sees a first attempt that
// committed in between, and a claim it finds beaten is undone (the lookup
// then replays the live row). At SERIALIZABLE the race is a serialization
// failure instead; at REPEATABLE READ nothing would catch it, so the call is
// refused (errRepeatableRead).
//
//	round trip 1: [SET modes;] claim_partitioned; assert_claimed_partitioned; [idle timeout;] BEGIN; SAVEPOINT idem_work
//	last round trip: [ROLLBACK TO SAVEPOINT idem_work;] complete_partitioned; COMMIT
type partitionedProtocol struct{ stmts *statements }

func (p partitionedProtocol) queueClaim(b *pgx.Batch, c *call, idle []any, _ bool) {
	b.Queue(p.stmts.part.claim, c.claimArgs()...)
	b.Queue(p.stmts.part.next, c.scopeArg, c.keyArg)
	if idle != nil {
		b.Queue(setIdleTimeoutSQL, idle...)
	}
}

func (p partitionedProtocol) readClaim(br pgx.BatchResults, c *call, _ bool) (claim, error) {
	t := &c.scan
	*t = claimTargets{}
	if err := br.QueryRow().Scan(&t.locked, &t.claimed, &t.hash, &t.status, &t.response, &t.refusal, &t.createdAt); err != nil {
		return claim{}, err
	}
	if t.claimed && t.createdAt != nil {
		c.createdAt = *t.createdAt
	}
	cl := t.claim()
	var verdict int32
	err := br.QueryRow().Scan(&verdict)
	switch {
	case err == nil && verdict < 0:
		// REPEATABLE READ, a session's default or an outer transaction's.
		return claim{}, errRepeatableRead(c)
	case !cl.claimed:
		return cl, nil // the assertion failed on purpose
	case isDivisionByZero(err):
		cl.lostRace()
		return cl, nil
	case err != nil:
		return claim{}, err
	}
	return cl, nil
}

func (p partitionedProtocol) queueComplete(b *pgx.Batch, c *call, fin *finish) {
	b.Queue(p.stmts.part.complete, c.scopeArg, c.keyArg, statusArg(fin.status), fin.response, fin.refusal, c.createdAt)
}

// completeError: the update found no row of the key in progress (22012).
func (partitionedProtocol) completeError(err error) error {
	return insertProtocol{}.completeError(err)
}

func (p partitionedProtocol) firstTrip() []string {
	return []string{p.stmts.part.claim, p.stmts.part.next, setIdleTimeoutSQL}
}

// errRepeatableRead refuses a call at REPEATABLE READ on a partitioned
// table: see assert_claimed_partitioned.sql.
func errRepeatableRead(c *call) error {
	return inputError(ErrInvalidOption, "REPEATABLE READ on the partitioned key table %s: its snapshot, taken before the key's lock, cannot see a first attempt that committed in between, and no unique index catches it across partitions; use READ COMMITTED or SERIALIZABLE", c.s.table)
}

func (partitionedProtocol) claimsInTx() bool { return false }
