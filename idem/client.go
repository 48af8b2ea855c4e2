package idem

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultTTL is how long a completed key is replayed when Config.TTL is not
// set: 24 hours, as Stripe keeps keys.
const DefaultTTL = 24 * time.Hour

// DefaultTable is the key table when Config.Table is not set.
const DefaultTable = "idempotency_keys"

// DefaultMaxResultBytes bounds the stored result when Config.MaxResultBytes
// is not set: 4 MiB. A result this large is almost always a mistake (a list
// that should have been paged); storing it would copy it into every replay
// and into the table for the key's whole lifetime.
const DefaultMaxResultBytes = 4 << 20

// DefaultSweepBatchSize is how many expired keys one sweep statement deletes
// when Config.SweepBatchSize is not set.
const DefaultSweepBatchSize = 1000

// DefaultIdleTimeout is Config.IdleTimeout when it is not set: 60 seconds.
// It is above the timeouts services usually give a call to an external
// processor made inside fn (a pause between two statements), and it bounds
// how long a frozen or partitioned process keeps its keys in progress: with
// PostgreSQL's own defaults (no idle_in_transaction_session_timeout, TCP
// keepalives after two hours) every retry of such a key would get
// ErrInProgress for hours.
const DefaultIdleTimeout = 60 * time.Second

// Config is a deployment's idem settings: what every call shares. The zero
// value means the defaults, which each field states. NewClient checks it
// once, at start-up.
type Config struct {
	// Table is the key table, optionally schema-qualified
	// ("billing.idempotency_keys"): a plain lower-case identifier, created by
	// schema.ApplyTable. Defaults to DefaultTable.
	Table string

	// TTL is how long a completed key is replayed, counted from the moment
	// it completed (not from the claim): a retry within TTL of the first
	// answer gets that answer, whatever the work took. Afterwards the key
	// counts as absent and a call runs fn again. Defaults to DefaultTTL
	// (24h); must not be negative.
	TTL time.Duration

	// Sealer, if set, seals what is stored under a key (the result, the
	// refusal, the status and the request hash) and opens it for a replay:
	// use it to encrypt results at rest and to detect tampering. Defaults to
	// none: results are stored as encoded.
	Sealer Sealer

	// Observer, if set, is told about every call: see Observer. A call's
	// WithObserver replaces it. Defaults to none, which costs nothing.
	Observer Observer

	// Logger receives what no caller would otherwise see: failed sweeps of
	// Client.SweepEvery. Defaults to none: SweepEvery then reports failures
	// to its onError, or, given neither, to slog.Default().
	Logger *slog.Logger

	// MaxResultBytes bounds the encoded result stored under a key. A larger
	// result fails the call with ErrResultTooLarge: nothing is stored and
	// fn's writes roll back. Defaults to DefaultMaxResultBytes (4 MiB); must
	// not be negative.
	MaxResultBytes int

	// SweepBatchSize is how many expired keys one statement of Sweep
	// deletes. Defaults to DefaultSweepBatchSize (1000); must not be
	// negative.
	SweepBatchSize int

	// IdleTimeout bounds how long a call's transaction stays open while its
	// client sends nothing. Every call sets PostgreSQL's
	// idle_in_transaction_session_timeout for its own transaction (a local
	// setting, sent in the round trip that carries BEGIN, so it costs no
	// round trip and ends with the transaction): if the process freezes, or
	// its network to PostgreSQL goes silent, while it holds a key, the
	// server ends the session once it has waited this long for the next
	// statement, rolls the call back and frees the key. Until then other
	// calls with the key get ErrInProgress; afterwards a retry runs fn.
	//
	// Idle time counts only between statements, so set it above the longest
	// pause fn makes: the timeout of any call to another service made inside
	// fn. A call whose fn pauses longer fails with a retryable error
	// (SQLSTATE 25P03, wrapped in a message that names this setting and
	// idem.Operation, the place for work that waits outside the database)
	// and nothing committed. Defaults to
	// DefaultIdleTimeout (60s); rounded up to whole milliseconds. A negative
	// value sends nothing and leaves the server's setting in force.
	//
	// It does not apply to a call on an outer pgx.Tx (Client.On(tx)): that
	// transaction is the caller's, and a local setting made inside it would
	// outlive the call's savepoint and govern the rest of the caller's
	// transaction. Set it there yourself (SET LOCAL at the start of the outer
	// transaction, or ALTER ROLE ... SET). docs/RELIABILITY.md covers what
	// else bounds a silent client: TCP keepalives, tcp_user_timeout and
	// client_connection_check_interval.
	IdleTimeout time.Duration

	// ColocateWith names, on a Citus cluster, the distributed business
	// table whose shards the key table must share: the table given to
	// schema.ApplyDistributed, distributed by the tenant that a call's scope
	// names, as the session's search_path resolves it (to_regclass).
	// Client.Check then reports a key table that is not colocated with it,
	// and a database without Citus. Only Check reads it, so it does not make NewClient's pool
	// refuse calls bare. Defaults to none: Check still reports a key table
	// that is not distributed while other tables are, but cannot tell which
	// colocation group is the tenant's.
	ColocateWith string
}

// A Client is a deployment's pool and its Config, checked once. It is a
// Beginner: pass it to Do, Run, Wrap and idemhttp wherever a database is
// expected, and they use its settings. It is safe for concurrent use. On
// gives a Client with the same settings on one transaction or connection
// (for Do inside an outer transaction); an Operation needs the pool itself,
// so NewOperation refuses a Client made by On.
//
//	keys, err := idem.NewClient(pool, &idem.Config{TTL: 48 * time.Hour, Logger: log})
//	...
//	payment, err := idem.Do(ctx, keys, key, hash, charge)
type Client struct {
	db   Beginner
	pool *pgxpool.Pool // db, unless the Client was made by On
	base settings
}

// NewClient returns a Client for pool with cfg (nil means the defaults). It
// checks cfg without touching the database; an invalid setting is an error
// wrapping ErrInvalidOption or ErrInvalidTable.
//
// If cfg sets anything other than the defaults, pool is no longer accepted
// bare: Do, Run, Wrap and the integrations given the pool itself fail with
// ErrInvalidOption before any database work, rather than run with the
// defaults (another table, another TTL, nothing sealed). Pass the Client. A
// pool with two Clients (two tables) is refused bare as well: each call site
// names the Client it means.
func NewClient(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, inputError(ErrInvalidOption, "NewClient: nil pool")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	s := defaultSettings()
	switch {
	case cfg.TTL < 0:
		return nil, inputError(ErrInvalidOption, "Config.TTL %v: must not be negative", cfg.TTL)
	case cfg.MaxResultBytes < 0:
		return nil, inputError(ErrInvalidOption, "Config.MaxResultBytes %d: must not be negative", cfg.MaxResultBytes)
	case cfg.SweepBatchSize < 0:
		return nil, inputError(ErrInvalidOption, "Config.SweepBatchSize %d: must not be negative", cfg.SweepBatchSize)
	case cfg.IdleTimeout > maxIdleTimeout:
		return nil, inputError(ErrInvalidOption, "Config.IdleTimeout %v: more than PostgreSQL accepts (%v)", cfg.IdleTimeout, maxIdleTimeout)
	}
	if cfg.Table != "" {
		s.table = cfg.Table
	}
	stmts, err := statementsFor(s.table)
	if err != nil {
		return nil, err
	}
	s.stmts = stmts
	if cfg.TTL > 0 {
		s.ttl = cfg.TTL
	}
	if cfg.MaxResultBytes > 0 {
		s.maxResult = cfg.MaxResultBytes
	}
	if cfg.SweepBatchSize > 0 {
		s.batch = cfg.SweepBatchSize
	}
	switch {
	case cfg.IdleTimeout < 0:
		s.idle = nil
	case cfg.IdleTimeout > 0:
		s.idle = idleSetting(cfg.IdleTimeout)
	}
	s.sealer, s.observer, s.logger = cfg.Sealer, cfg.Observer, cfg.Logger
	s.colocateWith = cfg.ColocateWith
	if !s.isDefault() {
		markConfigured(pool)
	}
	return &Client{db: pool, pool: pool, base: s}, nil
}

func defaultSettings() settings {
	stmts, _ := statementsFor(DefaultTable) // the default name always parses
	return settings{
		table:     DefaultTable,
		stmts:     stmts,
		ttl:       DefaultTTL,
		maxResult: DefaultMaxResultBytes,
		batch:     DefaultSweepBatchSize,
		idle:      defaultIdle,
	}
}

// maxIdleTimeout is the largest idle_in_transaction_session_timeout
// PostgreSQL accepts: INT_MAX milliseconds.
const maxIdleTimeout = (1<<31 - 1) * time.Millisecond

var defaultIdle = idleSetting(DefaultIdleTimeout)

// idleSetting is the argument of setIdleTimeoutSQL for d: the value of
// idle_in_transaction_session_timeout in milliseconds (the setting's unit),
// rounded up so that a small positive d never turns into 0, which would
// disable the timeout.
func idleSetting(d time.Duration) []any {
	return []any{strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)}
}

// Begin begins a plain transaction on the Client's database, without any
// key: it makes a Client a Beginner.
func (c *Client) Begin(ctx context.Context) (pgx.Tx, error) { return c.db.Begin(ctx) }

// BeginTx begins a plain transaction with opts on the Client's database,
// which must support options (pools and connections do; an outer pgx.Tx
// does not, and zero opts are then the only ones accepted).
func (c *Client) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	if tb, ok := c.db.(txBeginner); ok {
		return tb.BeginTx(ctx, opts)
	}
	if opts != (pgx.TxOptions{}) {
		return nil, inputError(ErrInvalidOption, "BeginTx: the database %T takes no transaction options", c.db)
	}
	return c.db.Begin(ctx)
}

// On returns a Client with the same settings on db: an outer pgx.Tx, say,
// so that Do runs in a savepoint of it and the key commits with it, or one
// connection of the pool. Given a Client, On uses that Client's database.
func (c *Client) On(db Beginner) *Client {
	if inner, ok := db.(*Client); ok {
		db = inner.db
	}
	pool, _ := db.(*pgxpool.Pool)
	return &Client{db: db, pool: pool, base: c.base}
}

// Table returns the key table the Client uses.
func (c *Client) Table() string { return c.base.table }

// TTL returns how long the Client replays a completed key.
func (c *Client) TTL() time.Duration { return c.base.ttl }

// ObserverOf returns the Observer that a call of Do or Run on db with opts
// reports to (the last WithObserver among opts, else db's Config.Observer
// if db is a Client, else nil) and the error wrapping ErrInvalidOption that
// every such call would fail with before any database work: an invalid
// option, or db given bare although a Client with settings was made on it
// (see NewClient). Integrations call it once, at start-up, to refuse such a
// configuration there and to report the requests they answer themselves,
// before any call (a malformed header, an oversized body), as
// OutcomeInvalid to the same Observer.
func ObserverOf(db Beginner, opts ...Option) (Observer, error) {
	_, base := resolve(db)
	s := base.with(opts, useRun)
	return s.observer, s.err
}

// resolve splits db into the database to run on and the settings to start
// from: a Client's, or the defaults, failed if db was given bare although a
// Client with settings was made on it.
func resolve(db Beginner) (Beginner, settings) {
	if c, ok := db.(*Client); ok && c != nil {
		return c.db, c.base
	}
	s := defaultSettings()
	s.fail(bareError(db))
	return db, s
}

// isDefault reports whether s are the settings a database given bare runs
// with, so that a Client with them need not be passed.
func (s *settings) isDefault() bool {
	d := defaultSettings()
	return s.table == d.table && s.ttl == d.ttl && s.maxResult == d.maxResult && s.batch == d.batch &&
		s.sealer == nil && s.observer == nil && s.logger == nil &&
		len(s.idle) == len(d.idle) && (len(s.idle) == 0 || s.idle[0] == d.idle[0])
}
