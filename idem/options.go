package idem

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// An Option adjusts one call of Do, Run or Wrap for what
// varies per call: WithWait, WithTxOptions, WithObserver. Deployment
// settings (table, TTL, sealer, observer, logger, limits) belong in Config,
// checked once by NewClient.
//
// An option given a value outside its range is an error wrapping
// ErrInvalidOption; the call then does nothing else.
// A nil Option is ignored.
type Option interface {
	apply(s *settings, u use)
}

// use is where an option is being applied.
type use uint8

const (
	useDo use = 1 << iota
	useRun
	useWrap

	useCall = useDo | useRun | useWrap // every kind of call
)

func (u use) String() string {
	switch u {
	case useDo:
		return "Do"
	case useRun:
		return "Run"
	default:
		return "Wrap"
	}
}

// option is the one implementation of Option: a name for messages, the uses
// where it applies, and what it sets.
type option struct {
	name  string
	where use
	set   func(*settings) error
}

func (o *option) apply(s *settings, u use) {
	if o.where&u == 0 {
		s.fail(inputError(ErrInvalidOption, "%s does not apply to %s", o.name, u))
		return
	}
	if err := o.set(s); err != nil {
		s.fail(err)
	}
}

// settings is the resolved configuration of one call: a Client's Config
// with the call's options applied.
type settings struct {
	table     string
	stmts     *statements
	ttl       time.Duration
	sealer    Sealer
	observer  Observer
	logger    *slog.Logger
	maxResult int
	batch     int
	// idle is the argument list of setIdleTimeoutSQL: the
	// idle_in_transaction_session_timeout a call sets for its own
	// transaction, in milliseconds, built once so that calls do not
	// allocate it; nil sends nothing (Config.IdleTimeout).
	idle []any

	wait   time.Duration
	txOpts pgx.TxOptions
	// operation is Wrap's: the call's scope is stored encoded with it.
	operation string
	// colocateWith is Config.ColocateWith, which only Check reads.
	colocateWith string
	err          error
}

func (s *settings) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// with returns a copy of s with opts applied for use u. The table's
// statements are looked up again if an option changed the table.
func (s settings) with(opts []Option, u use) settings {
	table := s.table
	for _, o := range opts {
		if o != nil {
			o.apply(&s, u)
		}
	}
	if s.err == nil && (s.stmts == nil || s.table != table) {
		stmts, err := statementsFor(s.table)
		if err != nil {
			s.fail(err)
		}
		s.stmts = stmts
	}
	return s
}

// WithWait makes a call whose key is in progress wait up to d for the first
// request to finish, then replay its result (or run fn, if the first attempt
// rolled back). The wait polls with backoff and jitter and holds no
// connection between polls. When d passes, the call returns ErrInProgress.
// Defaults to 0: answer ErrInProgress at once. Applies to Do, Run and Wrap.
func WithWait(d time.Duration) Option {
	return &option{name: "WithWait", where: useCall, set: func(s *settings) error {
		if d < 0 {
			return inputError(ErrInvalidOption, "WithWait(%v): must not be negative", d)
		}
		s.wait = d
		return nil
	}}
}

// WithTxOptions sets the isolation and deferrable modes of the transaction
// Do begins. AccessMode must not be read only (the key is written), and
// BeginQuery and CommitQuery are not supported. Given an outer pgx.Tx, whose
// modes are already set, the call fails with ErrInvalidOption. Defaults to
// the server's default (READ COMMITTED unless configured otherwise).
// IsoLevel and DeferrableMode must be one of pgx's constants or empty.
// A replay costs one round trip whatever the modes: on a pool or
// connection they are set in the pipeline that carries the claim, before
// its first snapshot. At READ COMMITTED, a call on a pool or connection
// writes the key's row once, when it completes; at REPEATABLE READ and
// SERIALIZABLE the claim inserts it and the completion updates it (see
// docs/PERFORMANCE.md). On a partitioned key table
// (schema.ApplyPartitioned) REPEATABLE READ is refused with an error wrapping
// ErrInvalidOption, and SERIALIZABLE keeps a key unique only if every call
// with that key runs at SERIALIZABLE: see docs/SCALING.md. Applies to Do, Run
// and Wrap.
func WithTxOptions(o pgx.TxOptions) Option {
	return &option{name: "WithTxOptions", where: useCall, set: func(s *settings) error {
		if o.AccessMode == pgx.ReadOnly || o.BeginQuery != "" || o.CommitQuery != "" {
			return inputError(ErrInvalidOption, "WithTxOptions: read-only access, BeginQuery and CommitQuery are not supported")
		}
		switch o.IsoLevel {
		case "", pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted:
		default:
			return inputError(ErrInvalidOption, "WithTxOptions: unknown isolation level %q (use pgx.Serializable, pgx.RepeatableRead or pgx.ReadCommitted)", o.IsoLevel)
		}
		switch o.DeferrableMode {
		case "", pgx.Deferrable, pgx.NotDeferrable:
		default:
			return inputError(ErrInvalidOption, "WithTxOptions: unknown deferrable mode %q (use pgx.Deferrable or pgx.NotDeferrable)", o.DeferrableMode)
		}
		s.txOpts = o
		return nil
	}}
}

// WithObserver sets the Observer told about this call, in place of
// Config.Observer. A nil o turns observation off for the call. Applies to
// Do, Run and Wrap.
func WithObserver(o Observer) Option {
	return &option{name: "WithObserver", where: useCall, set: func(s *settings) error {
		s.observer = o
		return nil
	}}
}
