package idem

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// insertProtocol is the card's shape: the claim inserts the key's row
// 'in_progress' under the key's advisory lock, fn runs, and the completion
// updates the row to its outcome before COMMIT. It runs on the plain table
// at REPEATABLE READ and SERIALIZABLE, where the claim's snapshot predates
// the lock and only the insertion's unique violation can see a first
// attempt that committed in between, and through nested at every level
// (chooseProtocol). On a pipeline:
//
//	round trip 1: [SET modes;] claim; assert_claimed; [idle timeout;] BEGIN; SAVEPOINT idem_work
//	last round trip: [ROLLBACK TO SAVEPOINT idem_work;] complete; COMMIT
//
// assert_claimed fails unless the claim inserted the row, so that a replay
// aborts the implicit transaction before BEGIN and costs one round trip.
// Inside an open transaction (nested) it is not sent: the attempt rolls
// back whatever the claim did not claim.
type insertProtocol struct{ stmts *statements }

func (p insertProtocol) queueClaim(b *pgx.Batch, c *call, idle []any, inTx bool) {
	b.Queue(p.stmts.insert.claim, c.claimArgs()...)
	if !inTx {
		b.Queue(p.stmts.insert.next, c.scopeArg, c.keyArg)
	}
	if idle != nil {
		b.Queue(setIdleTimeoutSQL, idle...)
	}
}

func (p insertProtocol) readClaim(br pgx.BatchResults, c *call, _ bool) (claim, error) {
	t := &c.scan
	*t = claimTargets{}
	if err := br.QueryRow().Scan(&t.locked, &t.claimed, &t.hash, &t.status, &t.response, &t.refusal); err != nil {
		return claim{}, err
	}
	return t.claim(), nil
}

func (p insertProtocol) queueComplete(b *pgx.Batch, c *call, fin *finish) {
	b.Queue(p.stmts.insert.complete, c.scopeArg, c.keyArg, statusArg(fin.status), fin.response, fin.refusal)
}

// completeError: the update found no row of the key in progress (22012).
func (insertProtocol) completeError(err error) error {
	switch {
	case isTxEnded(err):
		return fmt.Errorf("%w: %w", ErrTxEnded, err)
	case isKeyLost(err):
		return keyLostError(err)
	}
	return nil
}

func (p insertProtocol) firstTrip() []string {
	return []string{p.stmts.insert.claim, p.stmts.insert.next, setIdleTimeoutSQL}
}

func (insertProtocol) claimsInTx() bool { return false }
