package idem

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// A Beginner begins transactions. *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn,
// pgx.Tx and *Client all satisfy it; given a pgx.Tx, Do runs in a savepoint
// of that outer transaction and the key commits when the outer transaction
// does. A pool or connection on which NewClient made a Client with settings
// is refused bare (see NewClient).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Do runs fn at most once per key and returns its result to every call with
// that key, for as long as the key lives (Config.TTL after it completed).
//
// Do opens one transaction on db, claims key in it, runs fn in the same
// transaction, stores fn's result under the key and commits. The key, fn's
// writes and the stored result commit together or not at all. A later call
// with the same key and request hash returns the stored result without
// running fn (Run also says which happened). How the claim is made depends
// on db, the isolation level and the table's layout (see tx.go): the key is
// held by its advisory lock from the claim to COMMIT, and its row is either
// inserted as 'in_progress' by the claim and updated to its outcome before
// COMMIT, or, on a pool or connection at READ COMMITTED with the plain
// table, written once, with its outcome, before COMMIT. Either way the row
// and fn's writes commit in one transaction, and no other call can claim the
// key while it is held.
//
// db is usually a *Client (from NewClient, carrying the deployment's
// Config) or a *pgxpool.Pool (the defaults). The key lives in the scope that
// ctx carries (ContextWithScope), or in the empty scope. The empty scope is
// one namespace shared by every caller of the table, whatever its fn or
// result type: two callers that use one key there share one row, so the
// second's fn never runs and it is answered the first's stored result
// (two consumers of one event both keyed by the event id; two services
// keyed by one order id), or ErrCorruptRecord where that result shares no
// field with the second's result type. It is right only where one caller makes its keys
// (one service method keyed by its own job ids). Give every other caller a
// scope of its own: the authenticated principal for keys a client sends
// (idemhttp and idemgrpc refuse keyed requests without one), the consumer's
// name for messages (idemconsume does), the operation's name for a service
// method (Wrap does).
//
// reqHash fingerprints the request (see HashJSON and HashBytes): the same
// key with another hash returns ErrMismatch and fn does not run.
//
// Outcomes:
//   - fn returns nil: the result is stored and returned.
//   - fn returns an error wrapping a *Refusal: fn's writes roll back, the key
//     commits with the refusal and fn's value, and Do returns the value and
//     fn's error. Replays return the value and an equal *Refusal.
//   - fn returns any other error, or panics, or ctx ends, or the result cannot
//     be stored, or the server refuses COMMIT: everything rolls back, no
//     trace of the key remains, and the same key may be retried. fn's error
//     is returned as it is; a panic is re-raised after the rollback.
//   - COMMIT was sent and no reply confirmed or refused it (the connection
//     closed, or the server ended the session instead of answering): the
//     error wraps ErrOutcomeUnknown. Retry with the same key to learn the
//     outcome. COMMIT's own reply decides: a call whose COMMIT was confirmed
//     succeeded, whatever arrives after that reply. Through an outer
//     transaction the caller's COMMIT decides: use Commit to classify it.
//   - fn ended the transaction itself (a raw COMMIT or ROLLBACK through
//     Exec): ErrTxEnded, and nothing is stored.
//   - Another transaction holds the key: ErrInProgress at once, without
//     waiting for it (unless WithWait). A holder whose process froze or
//     whose network went silent keeps the key at most Config.IdleTimeout
//     (60s by default) after its last statement: the server then ends its
//     session and rolls it back, and the next call runs fn.
//   - Invalid key, scope, hash or option: an error wrapping ErrInvalidKey,
//     ErrInvalidScope, ErrInvalidRequestHash or ErrInvalidOption, before any
//     database work. One refusal comes after the first round trip: REPEATABLE
//     READ on a partitioned key table (ErrInvalidOption), which only the
//     table's layout reveals; nothing was written and fn did not run.
//
// The result is what every replay returns, exactly: Do stores it (as JSON,
// or with the type's MarshalBinary) and returns the stored form, so the first
// call and every replay return values that reflect.DeepEqual reports equal. A
// result type that JSON cannot carry exactly (an interface, an unexported
// or `json:"-"` field, a func or a channel) is refused before fn runs, with an
// error wrapping ErrInvalidOption that names the field: give it a
// MarshalBinary/UnmarshalBinary pair, or MarshalJSON/UnmarshalJSON, or use a
// plain struct.
//
// fn receives the transaction and must do all its database work through it.
// It must not commit or roll it back (both return ErrTxOwned, and the same
// statements sent through Exec fail the call with ErrTxEnded) nor keep it
// after returning. fn may run again after a failed attempt, so effects
// outside the database (a call to a payment gateway) need their own
// idempotency key: CallKey.Derive gives one.
//
// ctx governs every database call Do makes; fn should observe it too. When
// ctx ends, the transaction rolls back; a rollback is sent with ctx's values
// but without its cancellation, so the connection is left clean.
//
// With a pool or a connection, a first execution on a warm connection costs
// no round trip beyond those of a bare transaction doing fn's work: the claim
// travels with BEGIN, and the stored result with COMMIT. The first call on a
// connection also asks the catalog for the table's layout (one round trip)
// and prepares its statements. A replay is one round trip that takes no lock
// and writes nothing.
func Do[T any](ctx context.Context, db Beginner, key, reqHash string, fn func(pgx.Tx) (T, error), opts ...Option) (T, error) {
	v, _, err := run(ctx, db, key, reqHash, plainFn[T](fn), opts, useDo)
	return v, err
}

// plainFn adapts Do's fn, which takes no context.
type plainFn[T any] func(pgx.Tx) (T, error)

func (f plainFn[T]) call(_ context.Context, _ *call, tx pgx.Tx) (T, error) { return f(tx) }

func (f plainFn[T]) valid() bool { return f != nil }

// ctxFn is Run's fn, which takes the call's context.
type ctxFn[T any] func(context.Context, pgx.Tx) (T, error)

func (f ctxFn[T]) call(ctx context.Context, c *call, tx pgx.Tx) (T, error) {
	return f(contextWithKey(ctx, CallKey{Scope: c.scope, Key: c.key}), tx)
}

func (f ctxFn[T]) valid() bool { return f != nil }

// work is fn, whichever shape it was given in.
type work[T any] interface {
	call(ctx context.Context, c *call, tx pgx.Tx) (T, error)
	valid() bool // false for a nil function
}

// Run is Do that reports how the call ended, as singleflight's Do reports
// whether its result was shared, and gives fn the call's context.
//
// The Outcome is OutcomeExecuted or OutcomeRefused when fn ran and its
// result committed now, OutcomeReplayed when the result (or refusal) came
// from the stored row; for failures it names the failure, as the returned
// error does.
//
// fn's context is ctx with the call's key (KeyFromContext, so fn can derive
// downstream keys) and whatever the Observer's CallStart added. Everything
// else is as for Do.
func Run[T any](ctx context.Context, db Beginner, key, reqHash string, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...Option) (T, Outcome, error) {
	return run(ctx, db, key, reqHash, ctxFn[T](fn), opts, useRun)
}

// run is Do, Run and Wrap's shared body: resolve the settings, observe, and
// make attempts until one settles (more than one only with WithWait).
func run[T any, W work[T]](ctx context.Context, db Beginner, key, reqHash string, fn W, opts []Option, u use) (T, Outcome, error) {
	db, base := resolve(db)
	s := base.with(opts, u)
	return runSettled[T](ctx, db, &s, key, reqHash, fn)
}

func runSettled[T any, W work[T]](ctx context.Context, db Beginner, s *settings, key, reqHash string, fn W) (T, Outcome, error) {
	var (
		zero   T
		waited bool
	)
	scope, scopeErr := callScope(ctx, s)
	v, outcome, err := observe(ctx, s, scope, false, &waited, func(ctx context.Context) (T, Outcome, error) {
		if scopeErr != nil {
			return zero, OutcomeInvalid, scopeErr
		}
		return settle[T](ctx, db, s, scope, key, reqHash, fn, &waited)
	})
	if err != nil && outcome != OutcomeRefused && outcome != OutcomeReplayed {
		return zero, outcome, err
	}
	return v, outcome, err
}

// settle validates the call and attempts it, waiting between attempts while
// the key is in progress if WithWait allows.
func settle[T any, W work[T]](ctx context.Context, db Beginner, s *settings, scope, key, reqHash string, fn W, waited *bool) (T, Outcome, error) {
	var zero T
	if !fn.valid() {
		return zero, OutcomeInvalid, inputError(ErrInvalidOption, "no function to run")
	}
	c, err := newCall(s, scope, key, reqHash, db)
	if err != nil {
		return zero, OutcomeInvalid, err
	}
	if err := checkStorable[T](); err != nil {
		return zero, OutcomeInvalid, err
	}
	if err := ctx.Err(); err != nil {
		return zero, OutcomeFailed, err
	}
	var deadline time.Time
	if s.wait > 0 {
		deadline = time.Now().Add(s.wait)
	}
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, 250*time.Millisecond) {
		v, outcome, err := attempt[T](ctx, db, c, fn)
		if outcome != OutcomeInProgress || s.wait == 0 {
			return v, outcome, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return v, outcome, err
		}
		*waited = true
		// Jitter keeps waiters on one key from polling in lockstep.
		sleep := min(left, backoff/2+rand.N(backoff/2+1))
		if err := sleepCtx(ctx, sleep); err != nil {
			return zero, OutcomeFailed, err
		}
	}
}

// errAbandoned is the error observers receive for a call that did not
// return: fn panicked or exited its goroutine. Everything rolled back.
var errAbandoned error = abandoned{}

type abandoned struct{}

func (abandoned) Error() string {
	return "idem: the call panicked or its goroutine exited; everything rolled back"
}

// ErrorType names the error for telemetry (OpenTelemetry's error.type
// convention).
func (abandoned) ErrorType() string { return "panic" }

// isRefusal reports whether err holds a *Refusal. errors.AsType, unlike
// errors.As, needs no pointer that escapes: the observed path allocates
// nothing.
func isRefusal(err error) bool {
	r, ok := errors.AsType[*Refusal](err)
	return ok && r != nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
