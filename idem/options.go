package idem

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultTTL is how long a completed key is replayed when WithTTL is not
// given: 24 hours, as Stripe keeps keys.
const DefaultTTL = 24 * time.Hour

// An Option configures one call of Do, Wrap or Sweep. Options are the
// module's one configuration style: a call without options uses the
// defaults, and every option states its default. Build a slice once and pass
// it to every call to share a configuration.
type Option func(*config)

type config struct {
	ttl      time.Duration
	scope    string
	table    string
	wait     time.Duration
	txOpts   pgx.TxOptions
	replayed *bool
	sealer   Sealer
	batch    int
	err      error
}

func newConfig(opts []Option) config {
	c := config{ttl: DefaultTTL, table: "idempotency_keys", batch: 1000}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// WithTTL sets how long a completed key is replayed; after it the key counts
// as absent and the next call runs fn again. Defaults to DefaultTTL (24h).
// ttl must be positive.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) {
		if ttl <= 0 {
			c.setErr(inputError(ErrInvalidOption, "WithTTL(%v): must be positive", ttl))
		}
		c.ttl = ttl
	}
}

// WithScope sets the namespace of the key: the same key in two scopes is two
// unrelated keys, so one client can never replay another's stored result.
// Use the authenticated principal, tenant or operation. Defaults to "" (one
// shared namespace). At most 255 bytes of valid UTF-8 without control
// characters; otherwise Do returns ErrInvalidScope.
func WithScope(scope string) Option {
	return func(c *config) { c.scope = scope }
}

// WithTable sets the table that holds the keys, optionally schema-qualified
// ("billing.idempotency_keys"). It must be a plain lower-case identifier;
// otherwise Do returns ErrInvalidTable. Create it with schema.ApplyTable.
// Defaults to "idempotency_keys".
func WithTable(table string) Option {
	return func(c *config) { c.table = table }
}

// WithWait makes a call whose key is in progress wait up to d for the first
// request to finish, then replay its result (or run fn, if the first attempt
// rolled back). The wait polls with backoff and holds no connection between
// polls. When d passes, Do returns ErrInProgress. Defaults to 0: answer
// ErrInProgress at once.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.setErr(inputError(ErrInvalidOption, "WithWait(%v): must not be negative", d))
		}
		c.wait = d
	}
}

// WithTxOptions sets the isolation and deferrable modes of the transaction
// Do begins. AccessMode must not be read only (the key is written), and
// BeginQuery and CommitQuery are not supported. Ignored when Do is given an
// outer pgx.Tx, whose transaction is already open. Defaults to the server's
// default (READ COMMITTED unless configured otherwise).
func WithTxOptions(o pgx.TxOptions) Option {
	return func(c *config) {
		if o.AccessMode == pgx.ReadOnly || o.BeginQuery != "" || o.CommitQuery != "" {
			c.setErr(inputError(ErrInvalidOption, "WithTxOptions: read-only access, BeginQuery and CommitQuery are not supported"))
		}
		c.txOpts = o
	}
}

// WithReplayed makes Do set *p to whether the result it returns was replayed
// from a stored row (true) or produced by running fn now (false). The HTTP
// layer uses it to send Idempotent-Replayed. p must not be nil.
func WithReplayed(p *bool) Option {
	return func(c *config) {
		if p == nil {
			c.setErr(inputError(ErrInvalidOption, "WithReplayed(nil)"))
		}
		c.replayed = p
	}
}

// WithSealer makes Do pass every stored result through s: Seal before it is
// written, Open after it is read. Use it to encrypt or redact personal data
// at rest. Defaults to none: results are stored as encoded.
func WithSealer(s Sealer) Option {
	return func(c *config) { c.sealer = s }
}

// WithBatchSize sets how many expired keys Sweep deletes per statement.
// Defaults to 1000; must be positive.
func WithBatchSize(n int) Option {
	return func(c *config) {
		if n <= 0 {
			c.setErr(inputError(ErrInvalidOption, "WithBatchSize(%d): must be positive", n))
		}
		c.batch = n
	}
}

func (c *config) setErr(err error) {
	if c.err == nil {
		c.err = err
	}
}

// A Sealer transforms stored results: Seal before a result is written, Open
// after it is read back for a replay. scope and key identify the row; bind
// them as additional authenticated data when encrypting, so a sealed result
// cannot be moved to another key. An error from Seal rolls the call back
// (nothing is stored); an error from Open is returned wrapped in
// ErrCorruptRecord.
type Sealer interface {
	Seal(ctx context.Context, scope, key string, plain []byte) ([]byte, error)
	Open(ctx context.Context, scope, key string, sealed []byte) ([]byte, error)
}

// CheckOptions reports whether opts are valid, without touching a database:
// nil, or an error wrapping ErrInvalidOption, ErrInvalidScope or
// ErrInvalidTable. Do and Sweep check their options on every call; use
// CheckOptions to find a bad configuration at start-up.
func CheckOptions(opts ...Option) error {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return cfg.err
	}
	if err := validateScope(cfg.scope); err != nil {
		return err
	}
	_, err := statementsFor(cfg.table)
	return err
}
