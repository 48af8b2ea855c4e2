package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The transaction protocol. Every attempt of Do, Run and Wrap is one
// transaction in three steps (runTx):
//
//	claim     take the key's advisory lock and look at the key's row: claimed,
//	          or the stored answer (a replay, ErrMismatch), or ErrInProgress
//	fn        the caller's work, in the same transaction, after SAVEPOINT
//	          idem_work (a refusal rolls back to it and keeps the claim)
//	complete  store the outcome under the key, then COMMIT; COMMIT's own
//	          reply decides the outcome (lastTripError)
//
// Two things vary, each chosen once per attempt, before anything is sent.
//
// The transport, by the database a call was given (attempt):
//   - a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn: pipeline (pipeline.go).
//     The claim travels in one pipeline with BEGIN and the savepoint, and
//     the completion in one with COMMIT: no round trip beyond a bare
//     transaction, and a replay is one round trip.
//   - an outer pgx.Tx: nested (nested.go). The call is the savepoint
//     idem_call of the outer transaction, opened in the pipeline that
//     carries the claim and released in the one that carries the
//     completion: no round trip beyond the call's own statements.
//   - any other Beginner: nested, through its Begin and Commit.
//
// The protocol, by the transport, the isolation level and the table's
// layout (chooseProtocol); each owns its SQL files:
//
//	protocol         when                                   statements
//	deferredProtocol pipeline, READ COMMITTED, plain table  claim_deferred.sql, assert_deferred.sql,
//	                                                         complete_deferred.sql or complete_deferred_replace.sql
//	insertProtocol   pipeline at REPEATABLE READ or          claim.sql, assert_claimed.sql (pipeline only),
//	                 SERIALIZABLE; nested; plain table       complete.sql
//	partitionedProto partitioned table (schema.              claim_partitioned.sql, assert_claimed_partitioned.sql,
//	                 ApplyPartitioned), any transport        complete_partitioned.sql
//	citusProtocol    a database with the Citus extension     claim_citus.sql, insert_citus.sql,
//	                 (schema.ApplyDistributed), any          complete_citus.sql
//	                 transport and level
//
// insertProtocol is the card's shape: the claim inserts the key's row
// 'in_progress', and the completion updates it to its outcome before
// COMMIT. deferredProtocol writes the row once, with its outcome, before
// COMMIT: while the transaction holds the key's advisory lock no other call
// can claim the key, and assert_deferred.sql's own snapshot, taken after
// the lock, sees a first attempt that committed between the claim's
// snapshot and the lock. That second look needs READ COMMITTED; at
// REPEATABLE READ and SERIALIZABLE the snapshot is the claim's, and only
// the unique violation of insertProtocol's insertion can see that first
// attempt. Through nested, insertProtocol serves every level: it costs the
// same round trips there. For every caller the two are the same contract:
// the row and fn's writes commit in one transaction or not at all, and a
// replay reads only committed rows. docs/PERFORMANCE.md has the figures
// that keep deferredProtocol (one write of the key's row instead of two).
//
// citusProtocol is insertProtocol's shape with every statement routed to
// the key's shard and sent after BEGIN (protocol_citus.go; docs/SCALING.md
// says why the others cannot run on Citus).
//
// Besides the claim, the completion and COMMIT, an attempt sends: on a
// pipeline, the SET statements of WithTxOptions ahead of the claim (setTxSQL),
// BEGIN, SAVEPOINT idem_work, and the idle timeout (setIdleTimeoutSQL, or
// assert_deferred.sql's third argument); through nested, Begin's BEGIN
// (in an outer transaction, SAVEPOINT idem_call ahead of the claim) and
// SAVEPOINT idem_work; on a refusal, ROLLBACK TO SAVEPOINT idem_work before
// the completion; in an outer transaction, RELEASE SAVEPOINT idem_call after
// it instead of COMMIT; after a failure, ROLLBACK (in an outer transaction,
// ROLLBACK TO and RELEASE SAVEPOINT idem_call). The first
// call on a connection also asks layout.sql and prepares the claim's
// statements (prepareFirstTrip). A call that does not claim its key may
// send lookup.sql once (replay.go).

// A session is one attempt's transport: the pipelined path on a connection
// (pipeline.go) or the path through Begin, for an outer transaction or any
// other Beginner (nested.go). runTx is written once against it.
type session interface {
	// claim begins the transaction and claims the key in it. When the key
	// is not claimed it also reports what a retry must see.
	claim(ctx context.Context, c *call) (claim, error)
	// tx is the transaction handed to fn; closeTx makes it unusable.
	tx() pgx.Tx
	closeTx()
	// finish stores the outcome and commits.
	finish(ctx context.Context, c *call, fin *finish) error
	// abort rolls back whatever is open; it is safe to call more than once
	// and uses ctx's values without its cancellation.
	abort(ctx context.Context)
	// reader reads rows once the attempt's transaction is gone.
	reader() querier
	// ended reports that the claim's transaction is no longer open on the
	// connection: fn sent COMMIT, ROLLBACK, END or ABORT itself.
	ended() bool
}

// A protocol is one way to claim and complete a key: the statements it
// queues in the claim's round trip and before COMMIT, and how it reads
// their answers. inTx says the claim runs inside a transaction that is
// already open (nested), rather than ahead of BEGIN in a pipeline.
type protocol interface {
	// queueClaim queues the claim and its second look. idle is the idle
	// timeout to set for the transaction (Config.IdleTimeout), nil for none.
	queueClaim(b *pgx.Batch, c *call, idle []any, inTx bool)
	// readClaim reads what queueClaim's statements answered, and nothing
	// after them. A claim its second look undid is returned unclaimed.
	readClaim(br pgx.BatchResults, c *call, inTx bool) (claim, error)
	// queueComplete queues the statement that stores fin under the key.
	queueComplete(b *pgx.Batch, c *call, fin *finish)
	// completeError explains the completing statement's deliberate
	// failures (the key's row not as claimed), or returns nil.
	completeError(err error) error
	// firstTrip lists the claim's statements, to prepare by name.
	firstTrip() []string
	// claimsInTx says the claim must run inside the transaction, after
	// BEGIN, on a pipeline too (citusProtocol).
	claimsInTx() bool
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// attempt runs the protocol once on the transport fitting db.
func attempt[T any, W work[T]](ctx context.Context, db Beginner, c *call, fn W) (T, Outcome, error) {
	v, outcome, err := attemptOn[T](ctx, db, c, fn)
	_, outer := db.(pgx.Tx)
	return v, outcome, idleError(c, outer, err)
}

// attemptOn is attempt, on the session that suits db.
func attemptOn[T any, W work[T]](ctx context.Context, db Beginner, c *call, fn W) (T, Outcome, error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		conn, err := d.Acquire(ctx)
		if err != nil {
			var zero T
			return zero, OutcomeFailed, fmt.Errorf("idem: acquire a connection: %w", err)
		}
		// Release discards a connection left inside a transaction, so an
		// attempt that could not clean up never poisons the pool.
		defer conn.Release()
		return runTx[T](ctx, &pipeline{conn: conn.Conn()}, c, fn)
	case *pgxpool.Conn:
		return runTx[T](ctx, &pipeline{conn: d.Conn()}, c, fn)
	case *pgx.Conn:
		return runTx[T](ctx, &pipeline{conn: d}, c, fn)
	default:
		return runTx[T](ctx, &nested{db: db}, c, fn)
	}
}

// chooseProtocol picks the protocol of one attempt, once, before anything
// of it is sent (see the table above). stmts is the table's statement set
// as the connection's layout resolved it; pipelined says the claim runs
// ahead of BEGIN in a pipeline; iso is the transaction's isolation level:
// WithTxOptions', or else the session's default ("" where it is not known,
// through nested, which does not need it).
func chooseProtocol(c *call, stmts *statements, pipelined bool, iso pgx.TxIsoLevel) (protocol, error) {
	switch {
	case stmts.isCitus:
		return citusProtocol{stmts}, nil
	case stmts.isPartitioned && iso == pgx.RepeatableRead:
		return nil, errRepeatableRead(c)
	case stmts.isPartitioned:
		return partitionedProtocol{stmts}, nil
	case pipelined && (iso == pgx.ReadCommitted || iso == pgx.ReadUncommitted) && !forceInsertProtocol():
		return deferredProtocol{stmts}, nil
	}
	return insertProtocol{stmts}, nil
}

// runTx is the transaction protocol: claim the key, or settle a call that
// could not; run fn in the transaction; store its outcome and commit, or
// roll everything back.
func runTx[T any, W work[T]](ctx context.Context, s session, c *call, fn W) (T, Outcome, error) {
	var zero T
	cl, err := s.claim(ctx, c)
	if err != nil {
		s.abort(ctx)
		if errors.Is(err, ErrInvalidOption) {
			return zero, OutcomeInvalid, err
		}
		return zero, OutcomeFailed, claimError(c, err)
	}
	if !cl.claimed {
		s.abort(ctx)
		return unclaimed[T](ctx, s.reader(), c, cl)
	}

	finished := false
	defer func() {
		if !finished { // fn panicked: roll back, and let the panic go on.
			s.closeTx()
			s.abort(ctx)
		}
	}()
	v, fnErr := fn.call(ctx, c, s.tx())
	s.closeTx()
	if s.ended() {
		// The completing statement's marker check catches a transaction
		// ended and begun anew; this catches one left ended, on the error
		// path too, where nothing else would look.
		finished = true
		s.abort(ctx)
		if fnErr != nil {
			// fn's error is shown, not wrapped: a *Refusal in it must not
			// pass for a stored refusal.
			return zero, OutcomeFailed, fmt.Errorf("%w (fn returned: %v)", ErrTxEnded, fnErr) //nolint:errorlint // see above

		}
		return zero, OutcomeFailed, ErrTxEnded
	}

	fin, stored, err := finishing(ctx, c, v, fnErr)
	if err != nil {
		finished = true
		s.abort(ctx)
		return zero, OutcomeFailed, err
	}
	err = s.finish(ctx, c, &fin)
	finished = true
	if err != nil {
		s.abort(ctx)
		if errors.Is(err, ErrOutcomeUnknown) {
			return zero, OutcomeUnknown, err
		}
		return zero, OutcomeFailed, err
	}
	if fin.refused {
		return stored, OutcomeRefused, fnErr
	}
	return stored, OutcomeExecuted, nil
}

// queueFinish queues the round trip that ends a claimed attempt, up to but
// not including COMMIT: the rollback to the savepoint for a refusal, then
// the completing statement, whose index it returns.
func queueFinish(b *pgx.Batch, c *call, fin *finish) int {
	if fin.refused {
		b.Queue("rollback to savepoint idem_work")
	}
	at := b.Len()
	c.proto.queueComplete(b, c, fin)
	return at
}
