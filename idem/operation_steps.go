package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/dbtx"
)

// Steps is one owner's run of an Operation: the operation's function does
// its work through Step and External on it. Steps that an earlier owner
// recorded return their recorded output without running. A Steps is used
// by the goroutine that runs the operation's function, and only during
// that call.
type Steps struct {
	op    string
	c     *call
	pool  *pgxpool.Pool
	lease *lease
	key   CallKey // with the run
	ctx   context.Context
	// recorded holds the outputs recorded in this run, by step name, as
	// stored (sealed, if the Client has a Sealer).
	recorded map[string][]byte
	// begun holds the external steps whose call began in this run, in the
	// order they began.
	begun []string
	// ran holds the names used in this run: a name used twice is an error.
	ran map[string]bool
	// pend is the database step whose transaction is still open, if any;
	// held, the external steps' outputs not recorded yet (pending).
	pend *pending
	held []heldOutput
	// broken is why the run cannot go on: a pending step that did not
	// commit, or a fence whose outcome is unknown.
	broken error
}

// Context returns the context of the run: the caller's, carrying the key
// (KeyFromContext, DeriveKey), and ended when the owner loses its lease
// (context.Cause is then ErrLeaseLost).
func (s *Steps) Context() context.Context { return s.ctx }

// Key returns the operation's scope and key, and its run (CallKey.Run):
// Key().Derive(purpose) is a downstream key of this run, as External's.
func (s *Steps) Key() CallKey { return s.key }

// An ExternalCall is an external step of an operation's run that may have
// acted at its provider: its call began, and no output was recorded.
type ExternalCall struct {
	Step string // the step's name
	Key  string // the derived key the call was sent with
}

// Unrecorded returns the external steps of this run whose call began (its
// fence passed, External's first statement) and whose output was never
// recorded, in the order they began: the owner died, lost its lease or
// got an error after the call went out and before its next commit (which
// records the call's output, External), so the provider may have acted
// under Key, or may still act when a call that was already in flight
// arrives. Compensate undoes by these keys what the operation may have
// started (a refund or a void by idempotency key, or a look-up at the
// provider); steps that recorded an output are read with Recorded.
func (s *Steps) Unrecorded() []ExternalCall {
	var out []ExternalCall
	for _, name := range s.begun {
		if _, ok := s.recorded[name]; !ok {
			out = append(out, ExternalCall{Step: name, Key: s.key.Derive(name)})
		}
	}
	return out
}

// StepKind tells a database step from an external one, for observers.
type StepKind uint8

// The kinds of step.
const (
	// StepDatabase runs in a transaction of its own that commits with its
	// record (Step).
	StepDatabase StepKind = iota + 1
	// StepExternal runs with no transaction open and is recorded after it
	// returns (External).
	StepExternal
)

// String returns "database" or "external".
func (k StepKind) String() string {
	switch k {
	case StepDatabase:
		return "database"
	case StepExternal:
		return "external"
	}
	return "unknown"
}

// Step runs fn as the database step name of the operation, at most once:
// fn runs in a transaction of its own, in which the step's output is
// recorded before COMMIT, so fn's writes and the record commit together or
// not at all. A step recorded before (by this or an earlier owner of the
// operation) returns its recorded output, decoded, without running fn.
//
// The transaction begins by checking the owner's fencing token and locks
// the operation's row: no other owner takes the operation over while the
// step runs, and an owner that lost its lease gets ErrLeaseLost before fn
// runs. Config.IdleTimeout bounds its pauses as it does Do's.
//
// When fn returns, the transaction is left pending, and commits with what
// the owner does next: the next step's BEGIN, the next external step's
// fence, or the operation's answer (so a last step and the answer commit
// together). While pending, the session's idle timeout is the lease: an
// owner paused there past its lease has the step rolled back by the server
// and loses the operation, as one paused between steps does; a live owner
// that does not go on within a third of the lease has it committed by a
// timer. Until it commits, its writes are not visible to other
// connections, and rows it locked stay locked: read them in a later step,
// not from the pool between steps. A COMMIT that fails is reported by what
// carried it (the next Step, External, or Run), and the run stops there;
// a run that stops without an answer commits its pending step, unless fn
// panicked or the lease was lost (then it rolls back).
//
// An error from fn rolls the step back and is returned as it is: the
// operation's function decides (return a *Refusal to store it as the
// answer; any other error leaves the operation unfinished, to be continued
// by a retry). A lost reply to COMMIT is an error wrapping
// ErrOutcomeUnknown; a retry finds the step recorded, or runs it.
// T must encode and decode as Operation's Resp does.
func Step[T any](s *Steps, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	return step(s, name, StepDatabase, fn == nil, func(ctx context.Context) (T, error) { return runStep(ctx, s, name, fn) })
}

// step runs a step of either kind: the output this run recorded for name,
// if any, else run, observed.
func step[T any](s *Steps, name string, kind StepKind, noFn bool, run func(context.Context) (T, error)) (T, error) {
	if v, ok, err := replayed[T](s, name, kind); ok || err != nil {
		return v, err
	}
	if noFn {
		var zero T
		return zero, inputError(ErrInvalidOption, "step %q: nil function", name)
	}
	ctx, done := s.observe(name, kind)
	v, err := run(ctx)
	done(err)
	return v, err
}

func runStep[T any](ctx context.Context, s *Steps, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	var zero T
	if err := s.live(); err != nil {
		return zero, err
	}
	p, err := s.take()
	if err != nil {
		return zero, err
	}
	// The pending step commits first, in this step's first round trip: two
	// steps stay two transactions, so that one's failure or refusal never
	// undoes the other.
	var pc *pgxpool.Conn
	if p != nil {
		pc = p.conn
	} else if pc, err = s.pool.Acquire(ctx); err != nil {
		return zero, fmt.Errorf("idem: step %q: acquire a connection: %w", name, err)
	}
	conn := pc.Conn()
	kept := false
	defer func() {
		if !kept { // an error, or a panic on its way up
			rollbackConn(ctx, conn)
			pc.Release() // discards a connection left inside a transaction
		}
	}()

	// COMMIT of the pending step, BEGIN, the fence and the records of the
	// external steps' outputs held since their calls travel in one round
	// trip, as do the step's record and its idle timeout once fn returned:
	// a step costs two round trips beyond fn's own statements, as Do
	// does. fn gets the pipeline's transaction through connTx.
	held := s.held
	var b pgx.Batch
	if p != nil {
		b.Queue("commit")
	}
	b.Queue("begin")
	citus := s.c.stmts.op.onCitus()
	fenceArgs := []any{s.c.scope, s.c.key, s.lease.token, s.lease.micros, s.idle()}
	if citus {
		fenceArgs = fenceArgs[:4] // the idle timeout goes apart, below
	}
	b.Queue(s.c.stmts.op.fence, fenceArgs...)
	idle := s.idle()
	setIdle := citus && idle != nil
	if setIdle {
		b.Queue(setIdleTimeoutSQL, idle)
	}
	for _, h := range held {
		b.Queue(s.c.stmts.op.record, s.c.stmts.op.recordArgs(s.c.scope, s.c.key, s.lease.token, h.step, h.data, s.lease.micros, s.key.Run)...)
	}
	br := conn.SendBatch(ctx, &b)
	if p != nil {
		tag, err := br.Exec()
		if err == nil && tag.String() == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback
		}
		if err != nil {
			_ = br.Close()
			s.broken = s.pendingError(p, 0, err)
			return zero, s.broken
		}
	}
	var set string
	fenced := true
	_, err = br.Exec()
	if err == nil {
		if err = br.QueryRow().Scan(&set); errors.Is(err, pgx.ErrNoRows) {
			fenced, err = false, nil
		}
	}
	if err == nil && fenced && setIdle {
		_, err = br.Exec()
	}
	for range held {
		if err != nil || !fenced {
			break
		}
		var one int
		if err = s.c.stmts.op.noRow(br.QueryRow().Scan(&one)); errors.Is(err, pgx.ErrNoRows) {
			fenced, err = false, nil
		}
	}
	if cerr := br.Close(); err == nil && fenced {
		err = cerr
	}
	if err != nil {
		return zero, fmt.Errorf("idem: step %q: %w", name, err)
	}
	if !fenced {
		s.lease.lose()
		return zero, fmt.Errorf("%w: step %q did not run", ErrLeaseLost, name)
	}
	tx := &connTx{conn: conn}
	v, err := fn(ctx, tx)
	tx.closed.Store(true)
	if err != nil {
		return zero, err
	}
	if !conn.IsClosed() && conn.PgConn().TxStatus() == 'I' {
		// fn sent COMMIT or ROLLBACK itself: its writes may have committed
		// without the step's record.
		return zero, fmt.Errorf("%w (step %q)", ErrTxEnded, name)
	}
	data, stored, err := encodeStep(ctx, s, name, v)
	if err != nil {
		return zero, err
	}
	var last pgx.Batch
	last.Queue(s.c.stmts.op.record, s.c.stmts.op.recordArgs(s.c.scope, s.c.key, s.lease.token, name, data, s.lease.micros, s.key.Run)...)
	last.Queue(s.c.stmts.op.pending, s.pendingIdle())
	if _, err := execAll(conn.SendBatch(ctx, &last), last.Len()); err != nil {
		return zero, fmt.Errorf("idem: step %q: record: %w", name, err)
	}
	kept = true
	s.held = nil
	s.recorded[name] = data
	s.pend = &pending{conn: pc, step: name, held: held}
	s.flushLater(s.pend)
	return stored, nil
}

// A pending step is a database step whose transaction is still open when
// Step returned: its writes and its record commit with what the owner
// sends next, so that a step costs no COMMIT of its own:
//   - the next step: COMMIT travels with its BEGIN (two steps stay two
//     transactions);
//   - the next external step: its fence (operation_call.sql) runs in the
//     pending transaction, and COMMIT with it, before the call goes out;
//   - the operation's answer: operation_complete.sql and COMMIT;
//   - the run stopping without an answer (an error, ctx ended): COMMIT
//     alone; ROLLBACK when the lease was lost or fn panicked.
//
// The transaction holds the operation's row, which the fence locked: no
// takeover happens while it is pending (operation_take.sql's NOWAIT), and
// the renewer skips the row (the fence and the record renewed the lease).
// Two bounds keep that hold within the lease: the session's idle timeout
// is the lease from the step's last statement (operation_pending.sql), so
// the server ends the transaction of an owner paused with a step pending,
// rolling the step back; and a live owner that does not go on within a
// renewal interval (a third of the lease) has the step committed by a
// timer, as an unpaused owner would have renewed.
type pending struct {
	conn *pgxpool.Conn
	step string
	held []heldOutput // the external steps' outputs recorded in it

	mu    sync.Mutex
	timer *time.Timer
	done  bool  // taken by the owner, or ended by the timer
	err   error // how the timer's COMMIT failed
}

// heldOutput is an external step's output held in memory since its call
// returned, recorded (under the owner's fence) in the next transaction the
// owner commits. Until then the step is begun and unrecorded: an owner that
// dies before the record leaves it to Unrecorded and to the next owner's
// call with the same key, as a death during the call does.
type heldOutput struct {
	step string
	data []byte
}

// take returns the pending step, if there is one that the timer has not
// committed, for the owner to commit with what it sends next. An error is
// the timer's failed COMMIT, which stops the run.
func (s *Steps) take() (*pending, error) {
	p := s.pend
	if p == nil {
		return nil, nil
	}
	s.pend = nil
	p.mu.Lock()
	defer p.mu.Unlock()
	p.timer.Stop()
	if p.done {
		if p.err != nil {
			s.broken = p.err
		}
		return nil, p.err
	}
	p.done = true
	return p, nil
}

// flushLater commits p if the owner has not gone on within a renewal
// interval: a live owner keeps its step, whatever it does between steps.
// The timer's goroutine reads only what does not change during the run.
func (s *Steps) flushLater(p *pending) {
	p.timer = time.AfterFunc(s.lease.every, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.done {
			return
		}
		p.done = true
		ctx, cancel := cleanupContext(s.ctx)
		defer cancel()
		if s.lease.lost() {
			rollbackConn(ctx, p.conn.Conn())
			p.conn.Release()
			p.err = fmt.Errorf("%w: step %q rolled back", ErrLeaseLost, p.step)
			return
		}
		if err := s.commitPending(ctx, p); err != nil {
			p.err = err
		}
	})
}

// commitPending sends COMMIT for p alone and releases its connection.
func (s *Steps) commitPending(ctx context.Context, p *pending) error {
	var b pgx.Batch
	b.Queue("commit")
	failed, err := execAll(p.conn.Conn().SendBatch(ctx, &b), 1)
	if err != nil {
		rollbackConn(ctx, p.conn.Conn())
	}
	p.conn.Release()
	if err != nil {
		return s.pendingError(p, failed, err)
	}
	return nil
}

// pendingError is the error of a COMMIT of p that failed at index failed
// of its round trip (COMMIT first): the step rolled back, or its outcome
// is unknown. A session the server ended for idling past the lease
// (operation_pending.sql) means the owner paused past its lease with the
// step pending: the operation may be another owner's now.
func (s *Steps) pendingError(p *pending, failed int, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.IdleInTransactionSessionTimeout {
		s.lease.lose()
		return fmt.Errorf("%w: step %q rolled back: the owner paused past its lease with it pending: %w", ErrLeaseLost, p.step, err)
	}
	switch dbtx.ClassifyCommit(failed, 0, err) {
	case dbtx.Committed:
		return nil
	case dbtx.Unknown:
		return fmt.Errorf("%w: step %q: commit: %w", ErrOutcomeUnknown, p.step, err)
	}
	return fmt.Errorf("idem: step %q rolled back: %w", p.step, err)
}

// settle ends the run's open business when the run stops without storing
// an answer. With keep (fn returned an error, or ctx ended), the pending
// step commits and the held outputs are recorded, with a cleanup context:
// what the run did stays, as it would had each step committed on its own.
// Without (fn panicked), the pending step rolls back, and the outputs of
// the external steps are still recorded, in a transaction of their own:
// they are what the provider did, and the next owner need not ask it
// again. An owner that lost its lease records nothing.
func (s *Steps) settle(ctx context.Context, keep bool) error {
	p, err := s.take()
	if err != nil {
		return err
	}
	held := s.held
	s.held = nil
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	if p != nil && !keep {
		rollbackConn(ctx, p.conn.Conn())
		p.conn.Release()
		held = append(p.held, held...)
		p = nil
	}
	if s.lease.lost() {
		if p != nil {
			rollbackConn(ctx, p.conn.Conn())
			p.conn.Release()
		}
		return nil
	}
	if p == nil && len(held) == 0 {
		return nil
	}
	var pc *pgxpool.Conn
	if p != nil {
		pc = p.conn
	} else if pc, err = s.pool.Acquire(ctx); err != nil {
		return err
	}
	var b pgx.Batch
	if p == nil {
		b.Queue("begin")
	}
	for _, h := range held {
		b.Queue(s.c.stmts.op.record, s.c.stmts.op.recordArgs(s.c.scope, s.c.key, s.lease.token, h.step, h.data, s.lease.micros, s.key.Run)...)
	}
	b.Queue("commit")
	failed, err := execAll(pc.Conn().SendBatch(ctx, &b), b.Len())
	if err != nil {
		rollbackConn(ctx, pc.Conn())
	}
	pc.Release()
	if err != nil && p != nil {
		return s.pendingError(p, failed, err)
	}
	return err
}

// External runs fn as the external step name of the operation: a call to
// another service, made with no transaction open and no connection held.
// key is the idempotency key to send that service: the key of the
// operation's run derived for name (Key().Derive(name)). It is the same
// for every retry and every takeover of one run, so a service that honours
// it acts once however often the call is repeated; and it is new for each
// run, so a request that reuses the operation's key after the key expired
// or was forgotten never meets the old request's effects at the service.
// fn's output is recorded, under the owner's fence, in the next
// transaction the owner commits: the next step's, the next external step's
// fence, or the answer's; until then the step is begun and unrecorded, as
// while its call is in flight. A step recorded in this run returns its
// recorded output without calling fn.
//
// Right before fn is called, one statement checks the owner's fencing
// token, renews the lease and marks the step begun: an owner that lost the
// operation (paused past its lease, forgotten) gets ErrLeaseLost and calls
// nothing. A call that has begun cannot be fenced, so the operation
// remembers it: Compensate finds it in Unrecorded until its output is
// recorded. The context fn gets ends when a renewal finds the lease lost;
// External then returns an error wrapping ErrLeaseLost, records nothing,
// and the owner stops. Keep fn's own timeout below OperationConfig.Lease.
//
// fn is called again, with the same key, only when its output was not
// recorded: the owner died, paused past its lease or lost it after the
// service acted and before its next commit, or that commit's reply was lost
// (ErrOutcomeUnknown).
// An owner that lost its lease records nothing: External returns
// ErrLeaseLost, and the output the other owner records is the one that
// counts. An error from fn is returned as it is and records nothing.
func External[T any](s *Steps, name string, fn func(ctx context.Context, key string) (T, error)) (T, error) {
	return step(s, name, StepExternal, fn == nil, func(ctx context.Context) (T, error) { return runExternal(ctx, s, name, fn) })
}

func runExternal[T any](ctx context.Context, s *Steps, name string, fn func(ctx context.Context, key string) (T, error)) (T, error) {
	var zero T
	if err := s.live(); err != nil {
		return zero, err
	}
	if err := s.fence(ctx, name); err != nil {
		return zero, err
	}
	s.begun = append(s.begun, name)
	v, err := fn(ctx, s.key.Derive(name))
	switch {
	case s.lease.lost() && err != nil:
		return zero, fmt.Errorf("%w: step %q: %w", ErrLeaseLost, name, err)
	case s.lease.lost():
		// Another owner may hold the operation: it records the output,
		// calling with the same key.
		return zero, fmt.Errorf("%w: step %q was not recorded", ErrLeaseLost, name)
	case err != nil:
		return zero, err
	}
	data, stored, err := encodeStep(ctx, s, name, v)
	if err != nil {
		return zero, err
	}
	// The output is recorded, under the owner's fence, with the next
	// transaction the owner commits: the next step's, the next external
	// step's fence, or the answer's (which deletes every step's record).
	s.held = append(s.held, heldOutput{step: name, data: data})
	s.recorded[name] = data
	return stored, nil
}

// fence commits operation_call.sql, the fence of the external step name,
// before its call goes out: in the pending step's transaction if there is
// one, with the outputs held since earlier calls, and alone otherwise. It
// returns nil only once the fence committed.
func (s *Steps) fence(ctx context.Context, name string) error {
	p, err := s.take()
	if err != nil {
		return err
	}
	var one int
	if p == nil && len(s.held) == 0 {
		err := s.pool.QueryRow(ctx, s.c.stmts.op.call, s.c.scope, s.c.key, s.lease.token, name, s.lease.micros).Scan(&one)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			s.lease.lose()
			return fmt.Errorf("%w: step %q was not called", ErrLeaseLost, name)
		case err != nil:
			return fmt.Errorf("idem: step %q: fence: %w", name, err)
		}
		return nil
	}
	var pc *pgxpool.Conn
	if p != nil {
		pc = p.conn
	} else if pc, err = s.pool.Acquire(ctx); err != nil {
		return fmt.Errorf("idem: step %q: acquire a connection: %w", name, err)
	}
	conn := pc.Conn()
	defer pc.Release()
	held := s.held
	var b pgx.Batch
	if p == nil {
		b.Queue("begin")
	}
	for _, h := range held {
		b.Queue(s.c.stmts.op.record, s.c.stmts.op.recordArgs(s.c.scope, s.c.key, s.lease.token, h.step, h.data, s.lease.micros, s.key.Run)...)
	}
	b.Queue(s.c.stmts.op.call, s.c.scope, s.c.key, s.lease.token, name, s.lease.micros)
	b.Queue("commit")
	br := conn.SendBatch(ctx, &b)
	fenced, failed := true, -1
	i := 0
	if p == nil {
		if _, err = br.Exec(); err != nil {
			failed = 0
		}
		i++
	}
	for range len(held) + 1 {
		if err != nil {
			break
		}
		if err = s.c.stmts.op.noRow(br.QueryRow().Scan(&one)); errors.Is(err, pgx.ErrNoRows) {
			fenced, err = false, nil
		} else if err != nil {
			failed = i
		}
		i++
	}
	commitAt := i
	if err == nil {
		tag, cerr := br.Exec()
		switch {
		case cerr != nil:
			failed, err = commitAt, cerr
		case tag.String() == "ROLLBACK":
			failed, err = commitAt, pgx.ErrTxCommitRollback
		}
	}
	if cerr := br.Close(); cerr != nil && err == nil {
		failed, err = commitAt+1, cerr
	}
	if err != nil {
		rollbackConn(ctx, conn)
		switch dbtx.ClassifyCommit(failed, commitAt, err) {
		case dbtx.Committed:
		case dbtx.Unknown:
			// Whether the fence committed is unknown: nothing is called, and
			// the step, if begun, is for Unrecorded and the next owner.
			s.broken = fmt.Errorf("%w: step %q: fence: %w", ErrOutcomeUnknown, name, err)
			if p != nil {
				s.broken = fmt.Errorf("%w: step %q and the fence of step %q: %w", ErrOutcomeUnknown, p.step, name, err)
			}
			return s.broken
		default:
			if p != nil {
				// The pending step rolled back with the fence: the run
				// stops, lest it store an answer without the step.
				s.broken = s.pendingError(p, 0, err)
				return s.broken
			}
			return fmt.Errorf("idem: step %q: fence: %w", name, err)
		}
	}
	if !fenced {
		s.lease.lose()
		return fmt.Errorf("%w: step %q was not called", ErrLeaseLost, name)
	}
	s.held = nil
	return nil
}

// Recorded returns the output the step name recorded in this operation,
// and whether it did: for Compensate, to undo what the operation's steps
// did. It runs nothing.
func Recorded[T any](s *Steps, name string) (T, bool, error) {
	var zero T
	stored, ok := s.recorded[name]
	if !ok {
		return zero, false, nil
	}
	v, err := decodeStep[T](s, name, stored)
	return v, true, err
}

// replayed checks name and returns its recorded output, decoded, if it
// has one.
func replayed[T any](s *Steps, name string, kind StepKind) (T, bool, error) {
	var zero T
	if err := validateText(ErrInvalidOption, name); err != nil || name == "" {
		return zero, false, inputError(ErrInvalidOption, "invalid step name %q", name)
	}
	if s.ran[name] {
		return zero, false, inputError(ErrInvalidOption, "step %q runs twice in one operation; each step needs a name of its own", name)
	}
	s.ran[name] = true
	stored, ok := s.recorded[name]
	if !ok {
		return zero, false, nil
	}
	v, err := decodeStep[T](s, name, stored)
	if obs, isObs := s.c.s.observer.(StepObserver); isObs && err == nil {
		obs.StepEnd(s.ctx, StepEnd{Table: s.c.s.table, Scope: s.c.scope, Operation: s.op, Step: name, Kind: kind, Recorded: true})
	}
	return v, true, err
}

// decodeStep opens and decodes a recorded output.
func decodeStep[T any](s *Steps, name string, stored []byte) (T, error) {
	var zero T
	data := stored
	if s.c.s.sealer != nil {
		var err error
		if data, err = s.c.s.sealer.Open(s.ctx, s.c.scope, s.stepSealKey(name), stored); err != nil {
			return zero, fmt.Errorf("%w: step %q: open: %w", ErrCorruptRecord, name, err)
		}
	}
	v, err := decode[T](data)
	if err != nil {
		return zero, fmt.Errorf("%w: step %q: %w", ErrCorruptRecord, name, err)
	}
	return v, nil
}

// encodeStep returns the output as recorded, and as a replay of the step
// will see it.
func encodeStep[T any](ctx context.Context, s *Steps, name string, v T) ([]byte, T, error) {
	var zero T
	if err := checkStorable[T](); err != nil {
		return nil, zero, fmt.Errorf("step %q: %w", name, err)
	}
	data, err := encode(v)
	if err != nil {
		return nil, zero, fmt.Errorf("idem: step %q: encode the output: %w", name, err)
	}
	if len(data) > s.c.s.maxResult {
		return nil, zero, fmt.Errorf("%w: step %q: %d bytes encoded, more than %d (Config.MaxResultBytes)", ErrResultTooLarge, name, len(data), s.c.s.maxResult)
	}
	stored, err := storedForm(v, data)
	if err != nil {
		return nil, zero, err
	}
	if s.c.s.sealer != nil {
		if data, err = s.c.s.sealer.Seal(ctx, s.c.scope, s.stepSealKey(name), data); err != nil {
			return nil, zero, fmt.Errorf("idem: step %q: seal the output: %w", name, err)
		}
	}
	return data, stored, nil
}

// stepSealKey binds a sealed output to its step and its run, so that
// outputs cannot be swapped between steps, nor an output saved from an
// earlier run under the key replayed in a later one.
func (s *Steps) stepSealKey(step string) string {
	return s.c.key + "\x1fstep\x1f" + s.key.Run + "\x1f" + step
}

// live fails a step that would start after the lease was lost or ctx
// ended.
func (s *Steps) live() error {
	if s.broken != nil {
		return s.broken
	}
	if s.lease.lost() {
		return fmt.Errorf("%w: operation %q", ErrLeaseLost, s.op)
	}
	return s.ctx.Err()
}

// pendingIdle is the idle timeout of a pending step's session: the lease,
// in milliseconds.
func (s *Steps) pendingIdle() string {
	return idleSetting(time.Duration(s.lease.micros) * time.Microsecond)[0].(string)
}

func (s *Steps) idle() any {
	if s.c.s.idle == nil {
		return nil
	}
	return s.c.s.idle[0]
}

// load reads what earlier owners recorded.
func (s *Steps) load(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, s.c.stmts.op.steps, s.c.scope, s.c.key, s.key.Run)
	if err != nil {
		return fmt.Errorf("idem: operation %q: read its steps: %w", s.op, err)
	}
	for rows.Next() {
		var (
			name string
			out  []byte
		)
		if err := rows.Scan(&name, &out); err != nil {
			rows.Close()
			return fmt.Errorf("idem: operation %q: read its steps: %w", s.op, err)
		}
		s.recorded[name] = out
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("idem: operation %q: read its steps: %w", s.op, err)
	}
	return nil
}

// observe tells a StepObserver that a step starts, and returns the
// context for the step and the function that tells it the step ended.
func (s *Steps) observe(name string, kind StepKind) (context.Context, func(error)) {
	obs, ok := s.c.s.observer.(StepObserver)
	if !ok {
		return s.ctx, func(error) {}
	}
	start := time.Now()
	ctx := obs.StepStart(s.ctx, StepStart{Table: s.c.s.table, Scope: s.c.scope, Operation: s.op, Step: name, Kind: kind})
	return ctx, func(err error) {
		obs.StepEnd(ctx, StepEnd{Table: s.c.s.table, Scope: s.c.scope, Operation: s.op, Step: name, Kind: kind,
			Duration: time.Since(start), Err: err})
	}
}

// A StepObserver is an Observer that is also told about the steps of
// operations (Operation): a span or a duration per step. An Observer that
// does not implement it hears of an operation's calls only.
type StepObserver interface {
	Observer
	// StepStart runs before a step that is not recorded yet; the context
	// it returns is the step's.
	StepStart(ctx context.Context, step StepStart) context.Context
	// StepEnd runs once per StepStart when the step returns, and once for
	// a recorded step that returned its output without running (Recorded
	// set, no StepStart).
	StepEnd(ctx context.Context, step StepEnd)
}

// StepStart is what is known when a step begins.
type StepStart struct {
	Table     string // the key table
	Scope     string // the scope the operation's key is stored under
	Operation string // the operation's name
	Step      string // the step's name
	Kind      StepKind
}

// StepEnd is how a step ended.
type StepEnd struct {
	Table     string
	Scope     string
	Operation string
	Step      string
	Kind      StepKind
	// Recorded is true when the step had been recorded before and did not
	// run.
	Recorded bool
	// Duration is the step's wall time; 0 when Recorded.
	Duration time.Duration
	// Err is the error the step returned, nil on success.
	Err error
}
