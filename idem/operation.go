package idem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/dbtx"
)

// The protocol of an operation made of steps. Where Do holds one
// transaction for the whole call, an operation holds none between its
// steps, and a lease instead (operation_lease.go):
//
//	peek      operation_peek.sql, no transaction: the stored answer (a replay,
//	          ErrMismatch), or an owner at work (ErrInProgress), in one
//	          round trip
//	own       one short transaction in two round trips: BEGIN and
//	          operation_lock.sql (the key's advisory lock, Do's), then operation_begin.sql
//	          (the key's row 'unfinished', the operation's row, token and
//	          lease; OperationConfig.OnStart) or operation_take.sql (a lease that
//	          ended: a new token), with COMMIT
//	steps     operation_steps.sql reads what earlier owners recorded; each step not
//	          recorded runs (operation_steps.go): a database step in its own
//	          transaction, BEGIN with operation_fence.sql in one round trip, fn,
//	          then operation_record.sql and operation_pending.sql (the lease as
//	          the idle timeout) in another, and left pending: its COMMIT
//	          travels with what comes next. An external step runs with no
//	          transaction open, after its fence (operation_call.sql) committed,
//	          in the pending step's transaction if there is one; its output is
//	          recorded (operation_record.sql) in the next transaction the
//	          owner commits
//	complete  operation_complete.sql: the answer under the key, the operation's
//	          state deleted, fenced by the token; with COMMIT in the pending
//	          step's transaction, or one statement of its own
//
// So a charge (reserve, the processor's call, receipt) commits three times:
// the beginning, the reserve with the call's fence, the receipt with the
// call's output and the answer. A pending step holds the operation's row: an
// owner paused with one loses it within its lease (the server ends the
// idle transaction, and the step rolls back), and a live owner that does
// not go on within a third of its lease has it committed by a timer.
//
// The owner renews its lease (operation_renew.sql) while it works and ends it
// (operation_release.sql) when it stops on an error, so that a retry resumes at
// once. Every record an owner makes names its token: once another owner
// took the operation over, a stale owner's records match no row, its
// database step rolls back, and it stops with ErrLeaseLost.

// DefaultLease is OperationConfig.Lease when it is not set: 30 seconds.
const DefaultLease = 30 * time.Second

// minLease is the shortest lease accepted: renewals go out every third of
// it, and shorter would be mostly renewing.
const minLease = 100 * time.Millisecond

// OperationConfig is the settings of one Operation. The zero value means
// the defaults, which each field states.
type OperationConfig[Req, Resp any] struct {
	// Lease is how long an owner holds the operation without renewing: the
	// bound within which an owner that died (a crash, a SIGKILL, a lost
	// network) frees it for a retry or the completer. The owner renews it
	// every third of Lease while it works, on a connection of its own (a
	// pool exhausted by the work does not hold renewals back); an owner
	// paused past it (a long GC pause, SIGSTOP) loses the operation to the
	// next caller, calls out nothing and records nothing after that. Set
	// it above the longest pause you expect between renewals, and keep
	// external calls' timeouts below it. Defaults to DefaultLease (30s); at
	// least 100ms.
	Lease time.Duration

	// Deadline, if set, is how long after its beginning an operation may
	// keep trying to finish its work. An owner that takes the operation
	// over after the deadline runs Compensate instead of the operation's
	// function. The deadline is checked when an owner takes the operation,
	// not while it runs. Defaults to none: an unfinished operation is
	// resumed until it finishes. Must not be negative; needs Compensate.
	Deadline time.Duration

	// Compensate ends an operation that passed its Deadline: it runs with
	// the same Steps and cause, an error wrapping ErrDeadline, and its
	// result is stored and replayed as the operation's answer, usually a
	// *Refusal after undoing what the operation did. What it must undo:
	// the steps that recorded an output (Recorded), and the external steps
	// whose call began without an output recorded (Steps.Unrecorded), each
	// with the derived key its provider may have acted under, or may still
	// act under when a call in flight arrives: undo those by key (a void
	// or a refund by idempotency key, or a look-up at the provider). Its
	// own steps need names of their own. Required with Deadline, refused
	// without it.
	Compensate func(s *Steps, req Req, cause error) (Resp, error)

	// OnStart, if set, runs in the transaction that begins the operation
	// (before any of its steps), so that what it writes commits exactly
	// when the operation begins: idemriver's completer job, inserted with the
	// operation and scheduled past its lease, drives it to its end if no
	// client comes back. An error rolls the beginning back and fails the
	// call. Defaults to none.
	OnStart func(ctx context.Context, tx pgx.Tx, ref OperationRef) error
}

// An OperationRef names an unfinished operation: what a completer needs to
// resume it (Operation.Resume).
type OperationRef struct {
	Operation string // the name given to NewOperation
	Scope     string // the scope the key is stored under
	Key       string // the idempotency key
}

// A Resumer resumes unfinished operations by key: *Operation is one, and
// idemriver's completer takes any.
type Resumer interface {
	// Name returns the name the operation was registered with.
	Name() string
	// Resume drives the operation under scope and key to its end, as
	// Operation.Resume documents.
	Resume(ctx context.Context, scope, key string) (Outcome, error)
}

// An Operation is work under one idempotency key made of steps, for work
// too long to hold one transaction open: a call to a card processor, a
// bank, a shipping service. Each database step is its own short
// transaction that commits its writes with the step's record; each
// external step runs with no transaction open, with a key derived from the
// operation's, and its answer is recorded before the next step; the
// operation's result is stored under the key and replayed exactly as Do's.
//
// A call (Run) with a key whose operation is unfinished continues it from
// what its steps recorded: a recorded step does not run again. While an
// owner works, other calls get ErrInProgress at once. The owner holds a
// lease (OperationConfig.Lease): an owner that died frees the operation
// within it, and one that lost it records nothing more (fencing).
//
// The key is the same key Do uses: in the scope ctx carries, in the same
// table, with the Client's TTL, Sealer and Observer. While the operation
// is unfinished, Do with its key gets ErrInProgress, Lookup reports
// StatusUnfinished, Sweep leaves it alone and Stats counts it; once it
// finished, Do with its key and request hash replays its answer.
//
// Operations need the Client of a pool (NewClient, not On) and the plain
// table layout, which on a Citus cluster may be distributed
// (schema.ApplyDistributed; docs/SCALING.md).
// While owners work, the Operation keeps one connection of its own beside
// the pool, opened with the pool's settings and hooks (BeforeConnect,
// AfterConnect), on which it renews their leases; it closes it shortly
// after the last owner stops.
// docs/EXTERNAL_EFFECTS.md says when to use an Operation, Do, or a job
// after the answer.
type Operation[Req, Resp any] struct {
	client *Client
	pool   *pgxpool.Pool
	name   string
	fn     func(s *Steps, req Req) (Resp, error)
	cfg    OperationConfig[Req, Resp]
	lease  time.Duration
	// renewer renews the leases of this operation's owners at work.
	renewer *renewer
	// stmts is the key table's statement set, once checkLayout found the
	// plain layout: the Client's own, or its Citus set (distributed).
	stmts atomic.Pointer[statements]
}

// NewOperation returns the operation name, which runs fn with the Client c
// under cfg (nil means the defaults). name identifies the operation's keys
// for a completer (OperationRef) and enters the request hash, so the same
// key used for two operations is ErrMismatch. fn must do its work through
// Step and External on s, and may be run again after a crash or a lost
// lease: everything outside a step must be free of effects and give the
// same step names in the same order for the same request.
//
// Req and Resp must be types that encode to JSON (or that marshal
// themselves) and decode back to what was stored: the request is stored so
// that a completer can resume the operation without its client. An invalid
// argument is an error wrapping ErrInvalidOption, found here rather than
// at the first call.
func NewOperation[Req, Resp any](c *Client, name string, fn func(s *Steps, req Req) (Resp, error), cfg *OperationConfig[Req, Resp]) (*Operation[Req, Resp], error) {
	if c == nil {
		return nil, inputError(ErrInvalidOption, "NewOperation: nil Client")
	}
	pool := c.pool
	if pool == nil {
		return nil, inputError(ErrInvalidOption, "NewOperation: the Client was made by On, on a %T; an operation needs the Client of the pool (NewClient), whose connections its steps take and beside which its leases are renewed", c.db)
	}
	if err := validateText(ErrInvalidOption, name); err != nil || name == "" {
		return nil, inputError(ErrInvalidOption, "NewOperation: invalid name %q", name)
	}
	if fn == nil {
		return nil, inputError(ErrInvalidOption, "NewOperation %q: nil function", name)
	}
	if err := checkStorable[Req](); err != nil {
		return nil, fmt.Errorf("NewOperation %q: the request: %w", name, err)
	}
	if err := checkStorable[Resp](); err != nil {
		return nil, fmt.Errorf("NewOperation %q: the result: %w", name, err)
	}
	o := &Operation[Req, Resp]{client: c, pool: pool, name: name, fn: fn, lease: DefaultLease,
		renewer: newRenewer(pool)}
	if cfg != nil {
		o.cfg = *cfg
	}
	switch {
	case o.cfg.Lease < 0 || o.cfg.Lease > 0 && o.cfg.Lease < minLease:
		return nil, inputError(ErrInvalidOption, "NewOperation %q: Lease %v: at least %v", name, o.cfg.Lease, minLease)
	case o.cfg.Deadline < 0:
		return nil, inputError(ErrInvalidOption, "NewOperation %q: Deadline %v: must not be negative", name, o.cfg.Deadline)
	case o.cfg.Deadline > 0 && o.cfg.Compensate == nil:
		return nil, inputError(ErrInvalidOption, "NewOperation %q: a Deadline needs Compensate, which ends the operation past it", name)
	case o.cfg.Deadline == 0 && o.cfg.Compensate != nil:
		return nil, inputError(ErrInvalidOption, "NewOperation %q: Compensate runs only past a Deadline, which is not set", name)
	}
	if o.cfg.Lease > 0 {
		o.lease = o.cfg.Lease
	}
	return o, nil
}

// Name returns the operation's name.
func (o *Operation[Req, Resp]) Name() string { return o.name }

// Client returns the Client the operation was made with: its key table,
// where Lookup finds the operation's answer.
func (o *Operation[Req, Resp]) Client() *Client { return o.client }

// Run runs the operation for req under key, or continues it, or replays
// its answer; it returns the result and how the call ended, as Run does
// for a transaction:
//   - OutcomeExecuted (or OutcomeRefused, with the *Refusal as the error):
//     this call ran the operation's last step and stored its answer. Steps
//     that an earlier owner recorded were not run again.
//   - OutcomeReplayed: the answer was stored before; nothing ran.
//   - OutcomeInProgress (ErrInProgress): another owner holds the operation
//     right now; retry later, or leave it to the completer.
//   - OutcomeMismatch (ErrMismatch): the key was used with another request
//     or another operation, or by Do.
//   - OutcomeFailed: the operation stopped on an error (a step's, ctx's,
//     or ErrLeaseLost) and stays unfinished; what its steps recorded
//     stays, and a retry with the same key continues from there.
//   - OutcomeUnknown (ErrOutcomeUnknown): the connection failed while the
//     answer was being stored; a retry with the same key replays it or
//     finishes the operation.
//
// ctx governs the call: when it ends, the operation stops at the next step
// and stays unfinished for a retry or the completer. Step functions get a
// context that also ends when the lease is lost.
func (o *Operation[Req, Resp]) Run(ctx context.Context, key string, req Req) (Resp, Outcome, error) {
	var zero Resp
	s := o.client.base
	scope, err := callScope(ctx, &s)
	v, outcome, err := observe(ctx, &s, scope, false, nil, func(ctx context.Context) (Resp, Outcome, error) {
		if err != nil {
			return zero, OutcomeInvalid, err
		}
		reqData, hash, err := o.request(req)
		if err != nil {
			return zero, OutcomeInvalid, err
		}
		c, err := newCall(&s, scope, key, hash, o.pool)
		if err != nil {
			return zero, OutcomeInvalid, err
		}
		if err := ctx.Err(); err != nil {
			return zero, OutcomeFailed, err
		}
		return o.settle(ctx, c, &req, reqData)
	})
	if err != nil && outcome != OutcomeRefused && outcome != OutcomeReplayed {
		return zero, outcome, err
	}
	return v, outcome, err
}

// Resume drives the unfinished operation under scope and key to its end
// from the request stored with it, as a completer does when the client
// never came back. It returns a nil error once the operation has an
// answer: OutcomeExecuted or OutcomeRefused when this call stored it,
// OutcomeReplayed when it had finished before. Otherwise it returns
// ErrNotFound when the key holds nothing (never begun, or forgotten),
// ErrInProgress while another owner holds the operation, ErrMismatch when
// the unfinished key belongs to another operation, ErrCorruptRecord when
// the stored request does not open, decode or match the key's request
// hash (nothing runs then), and what Run would return for a failure. The
// Client's Observer hears of it as of a call of Run.
func (o *Operation[Req, Resp]) Resume(ctx context.Context, scope, key string) (Outcome, error) {
	s := o.client.base
	_, outcome, err := observe(ctx, &s, scope, true, nil, func(ctx context.Context) (Resp, Outcome, error) {
		var zero Resp
		if err := ValidateScope(scope); err != nil {
			return zero, OutcomeInvalid, err
		}
		// The request hash is the stored one, read by the first look (peek).
		c, err := newCall(&s, scope, key, resumeHash, o.pool)
		if err != nil {
			return zero, OutcomeInvalid, err
		}
		return o.settle(ctx, c, nil, nil)
	})
	if outcome == OutcomeRefused || outcome == OutcomeReplayed {
		return outcome, nil // a stored refusal is the operation's answer too
	}
	return outcome, err
}

// resumeHash stands for the request hash of a call of Resume until its
// first look reads the stored one.
const resumeHash = "resume"

// request encodes req for storage and hashes it with the operation's name.
func (o *Operation[Req, Resp]) request(req Req) ([]byte, string, error) {
	data, err := encode(req)
	if err != nil {
		return nil, "", inputError(ErrInvalidOption, "operation %q: encode the request: %v", o.name, err)
	}
	h, err := HashJSON(req)
	if err != nil && !codecOf[Req]().binary {
		return nil, "", inputError(ErrInvalidOption, "operation %q: hash the request: %v", o.name, err)
	}
	if codecOf[Req]().binary {
		h = HashBytes(data)
	}
	return data, HashBytes([]byte("idem/operation/v1\x1f" + o.name + "\x1f" + h)), nil
}

// settle answers from what the key holds, or owns the operation and runs
// it. req is nil for Resume, which takes the stored request.
func (o *Operation[Req, Resp]) settle(ctx context.Context, c *call, req *Req, reqData []byte) (Resp, Outcome, error) {
	var zero Resp
	stmts, err := o.checkLayout(ctx)
	if err != nil {
		return zero, OutcomeFailed, err
	}
	c.stmts = stmts
	// One retry: a key that a Do completed between operation_lock.sql's snapshot
	// and its lock is seen by the next look.
	for range 2 {
		p, err := o.peek(ctx, c)
		if err != nil {
			return zero, OutcomeFailed, err
		}
		if p.rec != nil && req == nil {
			c.reqHash = p.rec.requestHash
		}
		switch {
		case p.rec == nil && req == nil:
			return zero, OutcomeFailed, ErrNotFound
		case p.rec != nil && p.rec.status != statusUnfinished:
			return replay[Resp](ctx, c, p.rec)
		case p.rec != nil && p.rec.requestHash != c.reqHash:
			return zero, OutcomeMismatch, ErrMismatch
		case p.orphan:
			return zero, OutcomeFailed, fmt.Errorf("%w: the key is unfinished and has no operation state (was %s_operations changed by hand?)", ErrCorruptRecord, c.s.table)
		case p.rec != nil && p.leaseRunning:
			return zero, OutcomeInProgress, ErrInProgress
		}
		ow, err := o.own(ctx, c, reqData, req != nil)
		if errors.Is(err, errRaced) {
			continue
		}
		if err != nil {
			return zero, outcomeOf(err), err
		}
		if req == nil {
			var r Req
			if r, err = o.openRequest(ctx, c, ow.run, ow.request); err != nil {
				_ = o.release(ctx, c, ow.token, err)
				return zero, OutcomeFailed, err
			}
			req = &r
		}
		return o.work(ctx, c, ow, *req)
	}
	return zero, OutcomeInProgress, ErrInProgress
}

// errRaced is own's answer when the key's row changed under it: the next
// look reads it.
var errRaced = errors.New("idem: the key changed while the operation was taken")

func outcomeOf(err error) Outcome {
	switch {
	case errors.Is(err, ErrInProgress):
		return OutcomeInProgress
	case errors.Is(err, ErrMismatch):
		return OutcomeMismatch
	case errors.Is(err, ErrOutcomeUnknown):
		return OutcomeUnknown
	}
	return OutcomeFailed
}

// checkLayout refuses a partitioned key table, and returns the statement
// set of the table's layout: the Client's own, or its Citus set on a
// database with the Citus extension. It asks once per Operation.
func (o *Operation[Req, Resp]) checkLayout(ctx context.Context) (*statements, error) {
	if s := o.stmts.Load(); s != nil {
		return s, nil
	}
	var partitioned, citus bool
	base := o.client.base.stmts
	if err := o.pool.QueryRow(ctx, base.op.layout).Scan(&partitioned, &citus); err != nil {
		return nil, tableError(o.client.base.table, "operation "+o.name, err)
	}
	if partitioned {
		return nil, inputError(ErrInvalidOption, "operation %q: the key table %s is partitioned; operations need the plain layout (schema.Apply), since a partition is dropped whole once its keys expire", o.name, o.client.base.table)
	}
	s := base
	if citus {
		s = base.distributed
	}
	o.renewer.op.Store(&s.op)
	o.stmts.Store(s)
	return s, nil
}

// peeked is what operation_peek.sql found.
type peeked struct {
	rec          *storedRow
	leaseRunning bool
	// orphan: the key is unfinished and no operation row exists. One
	// statement reads both rows, and every statement that writes one
	// writes the other (operation_begin.sql, operation_complete.sql, forget.sql), so
	// only a hand edit leaves a key so.
	orphan bool
}

func (o *Operation[Req, Resp]) peek(ctx context.Context, c *call) (peeked, error) {
	var (
		rec   storedRow
		lease *bool
	)
	err := o.pool.QueryRow(ctx, c.stmts.op.peek, c.scope, c.key).
		Scan(&rec.requestHash, &rec.status, &rec.response, &rec.refusal, &lease)
	if errors.Is(err, pgx.ErrNoRows) {
		return peeked{}, nil
	}
	if err != nil {
		return peeked{}, tableError(c.s.table, "operation "+o.name+": look up key", err)
	}
	return peeked{
		rec:          &rec,
		leaseRunning: lease != nil && *lease,
		orphan:       rec.status == statusUnfinished && lease == nil,
	}, nil
}

// owned is an owner's hold on an operation.
type owned struct {
	token   int64
	run     string   // the run's identity (CallKey.Run)
	fresh   bool     // the run began with this owner: no steps recorded
	overdue bool     // past its deadline: compensate
	request []byte   // the stored request, when taken over
	begun   []string // the external steps the run began, when taken over
}

// own begins the operation, or takes it over from an owner whose lease
// ended, in one short transaction of two round trips: BEGIN with
// operation_lock.sql, then operation_begin.sql or operation_take.sql with COMMIT (with
// OperationConfig.OnStart, operation_begin.sql, the hook's statements and COMMIT
// go one after the other).
func (o *Operation[Req, Resp]) own(ctx context.Context, c *call, reqData []byte, canBegin bool) (ow owned, err error) {
	pc, err := o.pool.Acquire(ctx)
	if err != nil {
		return ow, fmt.Errorf("idem: operation %q: acquire a connection: %w", o.name, err)
	}
	defer pc.Release()
	conn := pc.Conn()
	done := false
	defer func() {
		if !done {
			rollbackConn(ctx, conn)
		}
	}()
	var (
		locked       bool
		hash, status *string
		live         *bool
		b            pgx.Batch
	)
	b.Queue("begin")
	b.Queue(c.stmts.op.lock, c.scope, c.key, c.lockArg).QueryRow(func(row pgx.Row) error {
		return row.Scan(&locked, &hash, &status, &live)
	})
	// On Citus the new token is drawn here and passed to operation_begin or
	// operation_take, which may not draw it themselves (newOpCitusSQL).
	var token []any
	if c.stmts.op.onCitus() {
		var t int64
		b.Queue(c.stmts.op.token).QueryRow(func(row pgx.Row) error { return row.Scan(&t) })
		token = []any{&t}
	}
	if err = conn.SendBatch(ctx, &b).Close(); err != nil {
		return ow, fmt.Errorf("idem: operation %q: lock the key: %w", o.name, err)
	}
	isLive := live != nil && *live
	switch {
	case !locked:
		return ow, ErrInProgress // a Do, or another caller, is claiming the key
	case isLive && *status != statusUnfinished:
		return ow, errRaced
	case isLive && *hash != c.reqHash:
		return ow, ErrMismatch
	case isLive:
		var (
			free, overdue *bool
			newToken      *int64
			name, run     *string
		)
		_, failed, err := queryCommit(ctx, conn, c.stmts.op.take, append([]any{c.scope, c.key, o.lease.Microseconds()}, token...),
			&free, &newToken, &name, &ow.request, &run, &ow.begun, &overdue)
		var pgErr *pgconn.PgError
		if failed == 0 && errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable {
			return ow, ErrInProgress // the owner is inside a database step
		}
		if err := o.ownCommitError(failed, 1, err, "take over"); err != nil {
			return ow, err
		}
		done = true
		switch {
		case free == nil:
			// The owner stored the answer since operation_lock.sql looked (its
			// completion takes no advisory lock), and the next look replays
			// it. unfinished cannot tell that from a corrupt key: the
			// completion may commit after operation_take.sql's snapshot, which
			// still sees the key unfinished, and before its lock, which then
			// finds the operation's row deleted. The next look (operation_peek.sql,
			// a new snapshot) tells them apart.
			return ow, errRaced
		case !*free:
			return ow, ErrInProgress
		case *name != o.name:
			// operation_take.sql took it: end the lease it took at once.
			_ = o.release(ctx, c, *newToken, ErrMismatch)
			return ow, fmt.Errorf("%w: the key belongs to operation %q, not %q", ErrMismatch, *name, o.name)
		}
		ow.token, ow.run, ow.overdue = *newToken, *run, *overdue
		return ow, nil
	case !canBegin:
		return ow, ErrNotFound
	}
	ow.run = newRunID()
	stored, err := o.sealRequest(ctx, c, ow.run, reqData)
	if err != nil {
		return ow, err
	}
	var deadline any
	if o.cfg.Deadline > 0 {
		deadline = o.cfg.Deadline.Microseconds()
	}
	args := append([]any{c.scope, c.key, c.reqHash, c.ttlMicro, o.name, stored, o.lease.Microseconds(), deadline, ow.run}, token...)
	if o.cfg.OnStart == nil {
		noRow, failed, err := queryCommit(ctx, conn, c.stmts.op.begin, args, &ow.token)
		if failed == 0 && errors.Is(c.stmts.op.noRow(err), pgx.ErrNoRows) {
			return ow, errRaced // on Citus; rolled back
		}
		if err := o.ownCommitError(failed, 1, err, "begin"); err != nil {
			return ow, err
		}
		done = true
		if noRow {
			return ow, errRaced
		}
		ow.fresh = true
		return ow, nil
	}
	err = conn.QueryRow(ctx, c.stmts.op.begin, args...).Scan(&ow.token)
	if errors.Is(c.stmts.op.noRow(err), pgx.ErrNoRows) {
		return ow, errRaced
	}
	if err != nil {
		return ow, fmt.Errorf("idem: operation %q: begin: %w", o.name, err)
	}
	tx := &connTx{conn: conn}
	err = o.cfg.OnStart(ctx, tx, OperationRef{Operation: o.name, Scope: c.scope, Key: c.key})
	tx.closed.Store(true)
	if err != nil {
		return ow, fmt.Errorf("idem: operation %q: OnStart: %w", o.name, err)
	}
	var last pgx.Batch
	last.Queue("commit")
	failed, err := execAll(conn.SendBatch(ctx, &last), 1)
	if err := o.ownCommitError(failed, 0, err, "begin"); err != nil {
		return ow, err
	}
	done = true
	ow.fresh = true
	return ow, nil
}

// ownCommitError classifies the round trip that carried own's COMMIT, at
// index commitAt.
func (o *Operation[Req, Resp]) ownCommitError(failed, commitAt int, err error, what string) error {
	if err == nil {
		return nil
	}
	switch dbtx.ClassifyCommit(failed, commitAt, err) {
	case dbtx.Committed:
		return nil
	case dbtx.Unknown:
		// Whether this call owns the operation is unknown; either way a
		// retry after the lease finds out.
		return fmt.Errorf("%w: operation %q: %w", ErrOutcomeUnknown, o.name, err)
	}
	return fmt.Errorf("idem: operation %q: %s: %w", o.name, what, err)
}

// queryCommit sends sql, which returns at most one row, and COMMIT in one
// round trip. It scans the row into dest, or reports noRow, and returns the
// index of the first result that failed (0: sql, 1: COMMIT, 2: the end of
// the round trip), for dbtx.ClassifyCommit.
func queryCommit(ctx context.Context, conn *pgx.Conn, sql string, args []any, dest ...any) (noRow bool, failed int, err error) {
	var b pgx.Batch
	b.Queue(sql, args...)
	b.Queue("commit")
	br := conn.SendBatch(ctx, &b)
	failed = -1
	if serr := br.QueryRow().Scan(dest...); errors.Is(serr, pgx.ErrNoRows) {
		noRow = true
	} else if serr != nil {
		_ = br.Close()
		return false, 0, serr
	}
	tag, cerr := br.Exec()
	switch {
	case cerr != nil:
		failed, err = 1, cerr
	case tag.String() == "ROLLBACK":
		failed, err = 1, pgx.ErrTxCommitRollback
	}
	if cerr := br.Close(); cerr != nil && err == nil {
		failed, err = 2, cerr
	}
	return noRow, failed, err
}

// work runs the operation as its owner and stores its answer.
func (o *Operation[Req, Resp]) work(ctx context.Context, c *call, ow owned, req Req) (Resp, Outcome, error) {
	var zero Resp
	l := o.startLease(ctx, c, ow.token)
	k := CallKey{Scope: c.scope, Key: c.key, Run: ow.run}
	s := &Steps{op: o.name, c: c, pool: o.pool, lease: l, key: k, ctx: contextWithKey(l.ctx, k),
		recorded: map[string][]byte{}, begun: ow.begun, ran: map[string]bool{}}
	if !ow.fresh {
		if err := s.load(ctx); err != nil {
			l.stop()
			_ = o.release(ctx, c, ow.token, err)
			return zero, OutcomeFailed, err
		}
	}
	finished := false
	defer func() {
		if !finished { // a step panicked: free the operation, let the panic go on.
			_ = s.settle(ctx, false)
			l.stop()
			_ = o.release(ctx, c, ow.token, errAbandoned)
		}
	}()
	var (
		v     Resp
		fnErr error
	)
	if ow.overdue {
		v, fnErr = o.cfg.Compensate(s, req, fmt.Errorf("%w: %v after its beginning", ErrDeadline, o.cfg.Deadline))
	} else {
		v, fnErr = o.fn(s, req)
	}
	finished = true
	l.stop()
	if l.lost() {
		_ = s.settle(ctx, false)
		return zero, OutcomeFailed, fmt.Errorf("%w: operation %q", ErrLeaseLost, o.name)
	}
	fin, stored, err := finishing(ctx, c, v, fnErr)
	if err != nil {
		// What the run did stays (Steps.settle).
		if serr := s.settle(ctx, true); serr != nil && errors.Is(serr, ErrLeaseLost) {
			return zero, OutcomeFailed, serr
		}
		_ = o.release(ctx, c, ow.token, err)
		return zero, OutcomeFailed, err
	}
	if err := ctx.Err(); err != nil {
		// Nothing is sent, and nothing is in doubt: the pool would refuse
		// a connection with ctx's error, which reads as unknown, and the
		// operation would stay held until its lease ran out. What the run
		// did stays, as it would had each step committed on its own.
		_ = s.settle(ctx, true)
		_ = o.release(ctx, c, ow.token, err)
		return zero, OutcomeFailed, err
	}
	n, err := o.complete(ctx, c, s, ow.token, fin)
	if err != nil {
		if errors.Is(err, ErrOutcomeUnknown) {
			return zero, OutcomeUnknown, err
		}
		if !errors.Is(err, ErrLeaseLost) {
			_ = o.release(ctx, c, ow.token, err)
		}
		return zero, OutcomeFailed, err
	}
	if n == 0 {
		return zero, OutcomeFailed, fmt.Errorf("%w: operation %q: the answer was not stored", ErrLeaseLost, o.name)
	}
	if fin.refused {
		return stored, OutcomeRefused, fnErr
	}
	return stored, OutcomeExecuted, nil
}

// complete stores the answer (operation_complete.sql): with COMMIT in the
// pending step's transaction if there is one, so that the last step and
// the answer commit together, and as a statement of its own otherwise. The
// outputs held since the last external calls are not recorded: the answer
// deletes every step's record.
func (o *Operation[Req, Resp]) complete(ctx context.Context, c *call, s *Steps, token int64, fin finish) (int, error) {
	p, err := s.take()
	if err != nil {
		return 0, err
	}
	s.held = nil
	args := []any{c.scope, c.key, token, statusArg(fin.status), fin.response, fin.refusal}
	var n int
	if p == nil {
		err := o.pool.QueryRow(ctx, c.stmts.op.complete, args...).Scan(&n)
		switch {
		case err != nil && dbtx.CommitOutcomeUnknown(err):
			return 0, fmt.Errorf("%w: operation %q: store the answer: %w", ErrOutcomeUnknown, o.name, err)
		case err != nil:
			return 0, fmt.Errorf("idem: operation %q: store the answer: %w", o.name, err)
		}
		return n, nil
	}
	defer p.conn.Release()
	conn := p.conn.Conn()
	_, failed, err := queryCommit(ctx, conn, c.stmts.op.complete, args, &n)
	if err == nil {
		return n, nil
	}
	rollbackConn(ctx, conn)
	if failed == 0 {
		if perr := s.pendingError(p, 0, err); errors.Is(perr, ErrLeaseLost) || errors.Is(perr, ErrOutcomeUnknown) {
			return 0, perr
		}
	}
	switch dbtx.ClassifyCommit(failed, 1, err) {
	case dbtx.Committed:
		return n, nil
	case dbtx.Unknown:
		return 0, fmt.Errorf("%w: operation %q: store the answer: %w", ErrOutcomeUnknown, o.name, err)
	}
	return 0, fmt.Errorf("idem: operation %q: store the answer (step %q rolled back with it): %w", o.name, p.step, err)
}

// release ends the owner's lease now, recording why it stopped. It uses
// ctx's values without its cancellation: a call stopped by ctx still frees
// its operation.
func (o *Operation[Req, Resp]) release(ctx context.Context, c *call, token int64, why error) error {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	msg := storableText(why.Error(), 1000)
	_, err := o.pool.Exec(ctx, c.stmts.op.release, c.scope, c.key, token, msg)
	if err != nil && Retryable(err) {
		// The pool may have handed out a connection that had died (the
		// fault that stopped the owner, often); the pool drops it, and a
		// second try on another frees the operation now rather than after
		// its lease.
		_, err = o.pool.Exec(ctx, c.stmts.op.release, c.scope, c.key, token, msg)
	}
	return err
}

// sealRequest is the request as stored: sealed with the Client's Sealer,
// if it has one, and bound to what decides what runs: the operation's
// name, its run and the request hash.
func (o *Operation[Req, Resp]) sealRequest(ctx context.Context, c *call, run string, data []byte) ([]byte, error) {
	if c.s.sealer == nil {
		return data, nil
	}
	sealed, err := c.s.sealer.Seal(ctx, c.scope, o.requestSealKey(c, run), data)
	if err != nil {
		return nil, fmt.Errorf("idem: operation %q: seal the request: %w", o.name, err)
	}
	return sealed, nil
}

// openRequest opens and decodes the stored request for Resume, and checks
// it against the key's request hash before anything runs: a request that
// a Sealer cannot open under this operation's name, run and hash, or that
// hashes otherwise (it was edited, or the operation's row renamed), is
// ErrCorruptRecord.
func (o *Operation[Req, Resp]) openRequest(ctx context.Context, c *call, run string, stored []byte) (Req, error) {
	var zero Req
	data := stored
	if c.s.sealer != nil {
		var err error
		if data, err = c.s.sealer.Open(ctx, c.scope, o.requestSealKey(c, run), stored); err != nil {
			return zero, fmt.Errorf("%w: operation %q: open the stored request: %w", ErrCorruptRecord, o.name, err)
		}
	}
	r, err := decode[Req](data)
	if err != nil {
		return zero, fmt.Errorf("%w: operation %q: decode the stored request: %w", ErrCorruptRecord, o.name, err)
	}
	if _, hash, err := o.request(r); err != nil || hash != c.reqHash {
		return zero, fmt.Errorf("%w: operation %q: the stored request does not match the key's request hash", ErrCorruptRecord, o.name)
	}
	return r, nil
}

// requestSealKey binds a sealed request to its operation, run and request
// hash, so that a row renamed, moved to another run or given another hash
// does not open.
func (o *Operation[Req, Resp]) requestSealKey(c *call, run string) string {
	return c.key + "\x1frequest\x1f" + o.name + "\x1f" + run + "\x1f" + c.reqHash
}
