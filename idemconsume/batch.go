package idemconsume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/idem"
)

// A BatchProcessor processes several deliveries in one database transaction
// and settles each. *Consumer is one; an adapter configured for batches
// (idemkafka's Config.Batch) needs its Processor to be one.
type BatchProcessor interface {
	Processor
	ProcessBatch(ctx context.Context, ms []*Message, settle func(i int) Settler) ([]Result, []error)
}

var _ BatchProcessor = (*Consumer)(nil)

// ErrBatchFailed is the reason of the retries of a batch whose transaction
// did not commit as a whole (ProcessBatch); the cause is wrapped with it.
var ErrBatchFailed = errors.New("idemconsume: the batch's transaction did not commit")

// ProcessBatch handles one delivery of each of ms in a single transaction
// and then settles each through settle(i), as Process would have: results[i]
// and errs[i] are what Process(ctx, ms[i], settle(i)) would have returned.
// It calls settle(i) only when it settles ms[i], at most once for each i.
//
// The transaction is begun on the consumer's database, and each message's
// handler runs through idem.Run on it, in a savepoint of its own: its key
// commits with the batch. So, as in Process, a message whose handler failed
// rolls back alone and is retried, a refusal is stored and acked, a message
// whose key another delivery holds is retried after Config.InProgressDelay
// without waiting for it, a mismatched payload is dead-lettered, and a
// message whose key an earlier message of the batch used is a duplicate,
// acked without running the handler. Nothing is acked before the batch's
// COMMIT answered.
//
// When the batch's transaction does not commit as a whole (COMMIT failed or
// its outcome is unknown, or a message's failure ended the transaction or
// would make COMMIT fail: a terminated backend, a lost connection, a
// deadlock or serialization failure, SQLSTATE class 40), every message with
// a key is retried, with ErrBatchFailed: the redelivery replays those whose
// keys did commit, and runs the others. Such a retry never dead-letters,
// since the failure need not be the message's: process the messages one by
// one (Process) after it, so that one that breaks every batch is found and
// dead-lettered by Config.MaxDeliveries.
//
// ctx governs the batch's transaction. When ctx ends before COMMIT
// answered, nothing commits and ProcessBatch settles only the messages
// dead-lettered without a key; the others' errs are ctx's error, and the
// broker redelivers them.
//
// A batch costs one COMMIT instead of one per message, which is most of a
// small handler's cost, and is paid for in three ways: every message's ack
// waits for the slowest handler of the batch and for the batch's COMMIT; the
// keys' locks are held until then, so another instance that receives one of
// them retries it later; and a batch that fails as a whole sends all its
// messages back. Each message costs two savepoints (the message's and
// idem's own), and PostgreSQL keeps only 64 subtransactions of a
// transaction in its shared cache: batches of more than about 30 messages
// that write make other sessions' snapshots look further while they are
// open. docs/CONSUMERS.md has the figures.
func (c *Consumer) ProcessBatch(ctx context.Context, ms []*Message, settle func(i int) Settler) (results []Result, errs []error) {
	start := time.Now()
	results, errs = make([]Result, len(ms)), make([]error, len(ms))
	ctxs := make([]context.Context, len(ms))
	for i, m := range ms {
		ctxs[i] = ctx
		if c.obs != nil {
			ctxs[i] = c.obs.MessageStart(ctx, c.name, m)
		}
	}
	c.handleBatch(ctx, ctxs, ms, results)
	for i, res := range results {
		if ctx.Err() != nil && res.Action == Retry {
			errs[i] = ctx.Err() // shutting down: the broker redelivers
		} else {
			errs[i] = c.settle(ctxs[i], settle(i), res)
		}
		if c.obs != nil {
			c.obs.MessageEnd(ctxs[i], Event{Consumer: c.name, Deliveries: ms[i].deliveries(), Result: res,
				SettleErr: errs[i], Duration: time.Since(start)})
		}
	}
	return results, errs
}

// handleBatch runs each message's handler in one transaction and decides
// each one's action once COMMIT answered.
func (c *Consumer) handleBatch(ctx context.Context, ctxs []context.Context, ms []*Message, results []Result) {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		c.failBatch(ms, results, idem.OutcomeFailed, fmt.Errorf("begin: %w", err))
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after COMMIT: pgx.ErrTxClosed
	// On a Client, its settings (table, TTL) go with the transaction.
	var db idem.Beginner = tx
	if cl, ok := c.db.(*idem.Client); ok {
		db = cl.On(tx)
	}
	for i, m := range ms {
		results[i] = c.handleOn(ctxs[i], db, m)
		if ctx.Err() != nil {
			c.failBatch(ms, results, idem.OutcomeFailed, ctx.Err())
			return
		}
		if err := batchBroken(tx, results[i]); err != nil {
			c.failBatch(ms, results, idem.OutcomeFailed, err)
			return
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// An ERROR in reply to COMMIT rolled the batch back; a FATAL or no
		// reply at all leaves its outcome unknown.
		outcome := idem.OutcomeUnknown
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Severity == "ERROR" || errors.Is(err, pgx.ErrTxCommitRollback) {
			outcome = idem.OutcomeFailed
		}
		c.failBatch(ms, results, outcome, fmt.Errorf("commit: %w", err))
	}
}

// batchBroken returns why the batch's transaction cannot commit after the
// message that ended with res, or nil if it can.
func batchBroken(tx pgx.Tx, res Result) error {
	if conn := tx.Conn(); conn.IsClosed() || conn.PgConn().TxStatus() != 'T' {
		return fmt.Errorf("the transaction ended: %w", res.Err)
	}
	if res.Outcome == idem.OutcomeUnknown {
		return res.Err
	}
	var pgErr *pgconn.PgError
	if res.Outcome == idem.OutcomeFailed && errors.As(res.Err, &pgErr) &&
		(pgerrcode.IsTransactionRollback(pgErr.Code) || pgerrcode.IsConnectionException(pgErr.Code) ||
			pgerrcode.IsOperatorIntervention(pgErr.Code)) {
		// A savepoint can undo the statement, but not the conflict: a
		// serializable transaction would fail at COMMIT, a deadlock may
		// recur with the same neighbour.
		return res.Err
	}
	return nil
}

// failBatch sets every message with a key to be retried with cause: none of
// the batch committed (outcome idem.OutcomeFailed), or it is not known
// whether it did (idem.OutcomeUnknown).
func (c *Consumer) failBatch(ms []*Message, results []Result, outcome idem.Outcome, cause error) {
	for i, m := range ms {
		if _, err := m.key(); err != nil {
			results[i] = Result{Action: DeadLetter, Outcome: idem.OutcomeInvalid, Err: err}
			continue
		}
		delay := c.backoff(m.deliveries())
		if outcome == idem.OutcomeUnknown {
			delay = c.backoff(1) // the redelivery learns the outcome
		}
		results[i] = Result{Action: Retry, Outcome: outcome, Delay: delay,
			Err: fmt.Errorf("%w: %w", ErrBatchFailed, cause)}
	}
}
