package idemconsume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// A Handler does one message's work in tx, the transaction its key commits
// in. It must do all its database work through tx and must not commit or
// roll it back. Returning nil commits; returning an error that wraps an
// *idem.Refusal commits the refusal (the handler's writes roll back) and the
// message is acknowledged; any other error rolls everything back and the
// message is delivered again. ctx is Process's, with the key
// (idem.KeyFromContext) and whatever the Observer added.
type Handler func(ctx context.Context, tx pgx.Tx, m *Message) error

// Config is a consumer's settings. The zero value of every field but Name
// means its default.
type Config struct {
	// Name names the consumer: its keys live in the scope "consumer:" +
	// Name, so two consumers of one stream each process a message once.
	// Required; it must stay the same across restarts and instances.
	Name string
	// MaxDeliveries is how many deliveries of a message may fail (the
	// handler returned an error, the database was unreachable) before it is
	// dead-lettered. Deliveries that found the key in progress or whose
	// outcome was unknown count towards it only as the broker counts them,
	// and never dead-letter by themselves. Defaults to 5.
	MaxDeliveries int
	// Backoff is the delay before the next delivery after the failed
	// delivery number n (1 for the first). Defaults to 200ms doubled each
	// time, at most 30s.
	Backoff func(n int) time.Duration
	// InProgressDelay is the delay before the next delivery of a message
	// whose key another transaction holds (another instance is working on
	// it, e.g. after a rebalance). Defaults to 1s.
	InProgressDelay time.Duration
	// Observer hears of every message; nil for none. Counters is one.
	Observer Observer
}

// A Consumer processes messages for one consumer name. It is safe for
// concurrent use; the adapters run it from one goroutine per partition,
// subscription or channel.
type Consumer struct {
	db      idem.Beginner
	handler Handler
	name    string
	scope   string
	max     int
	backoff func(int) time.Duration
	waitFor time.Duration
	obs     Observer
}

// New returns a consumer that runs h for each message in a transaction on
// db (an *idem.Client carries the key table and TTL; a pool uses the
// defaults, and is refused if a Client with settings was made on it). It
// checks cfg once: an error names what is wrong.
func New(db idem.Beginner, cfg *Config, h Handler) (*Consumer, error) {
	switch {
	case db == nil:
		return nil, errors.New("idemconsume: no database")
	case h == nil:
		return nil, errors.New("idemconsume: no handler")
	case cfg == nil || cfg.Name == "":
		return nil, errors.New("idemconsume: Config.Name is required: it is the scope of the consumer's keys")
	case cfg.MaxDeliveries < 0, cfg.InProgressDelay < 0:
		return nil, errors.New("idemconsume: MaxDeliveries and InProgressDelay must not be negative")
	}
	if _, err := idem.ObserverOf(db); err != nil {
		return nil, fmt.Errorf("idemconsume: %w", err)
	}
	scope := "consumer:" + cfg.Name
	if err := idem.ValidateScope(scope); err != nil {
		return nil, fmt.Errorf("idemconsume: Config.Name: %w", err)
	}
	c := &Consumer{db: db, handler: h, name: cfg.Name, scope: scope,
		max: cfg.MaxDeliveries, backoff: cfg.Backoff, waitFor: cfg.InProgressDelay, obs: cfg.Observer}
	if c.max == 0 {
		c.max = 5
	}
	if c.backoff == nil {
		c.backoff = defaultBackoff
	}
	if c.waitFor == 0 {
		c.waitFor = time.Second
	}
	return c, nil
}

func defaultBackoff(n int) time.Duration {
	d := 200 * time.Millisecond
	for i := 1; i < n && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}

// Name returns the consumer's name (Config.Name).
func (c *Consumer) Name() string { return c.name }

// A Settler tells the broker what became of one delivery. Process calls
// exactly one of its methods, after the handler's transaction answered, or
// none when ctx ended first. An adapter implements it for its broker; each
// method should return only once the broker took the action, where the
// broker says so (a confirmed ack, a published dead letter).
type Settler interface {
	// Ack makes the broker forget the message: its effect committed, or
	// it was a duplicate, or a refusal was stored.
	Ack(ctx context.Context) error
	// Retry makes the broker deliver the message again after delay, to
	// this or another instance.
	Retry(ctx context.Context, delay time.Duration) error
	// DeadLetter moves the message to the dead-letter destination with
	// reason, then makes the broker forget it.
	DeadLetter(ctx context.Context, reason error) error
}

// A Processor processes one delivery and settles it. *Consumer is the one
// that makes a message's effect exactly-once; the adapters accept any, so
// that a wrapper (logging, a test's fault injection) fits between.
type Processor interface {
	Process(ctx context.Context, m *Message, s Settler) (Result, error)
}

var _ Processor = (*Consumer)(nil)

// Action is what Process told the broker.
type Action uint8

// The actions.
const (
	Ack Action = iota + 1
	Retry
	DeadLetter
)

// String returns "ack", "retry" or "dead_letter".
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead_letter"
	}
	return "none"
}

// Result says how one delivery ended.
type Result struct {
	Action  Action
	Outcome idem.Outcome // Run's outcome; OutcomeInvalid when there was no usable key
	Delay   time.Duration
	// Err is why the message was retried or dead-lettered (the handler's
	// error, idem.ErrInProgress, idem.ErrMismatch, ErrDeliveryLimit, ...),
	// or the refusal that was stored; nil for a plain Ack.
	Err error
}

// ErrNoKey is the dead-letter reason of a message with neither a producer
// id nor a broker position.
var ErrNoKey = errors.New("idemconsume: the message has no id and no position to key it by")

// ErrDeliveryLimit is the dead-letter reason of a message whose deliveries
// failed Config.MaxDeliveries times; the last failure is wrapped with it.
var ErrDeliveryLimit = errors.New("idemconsume: delivery limit reached")

// Process handles one delivery of m: it runs the handler under m's key and
// then settles the delivery through s, as the package documentation's table
// says. It returns how the delivery ended and the Settler's error, if any.
//
// ctx governs the handler's transaction. When ctx ends before the
// transaction answered, nothing commits and Process calls no Settler
// method: it returns ctx's error, and the broker redelivers the message (its
// ack deadline passes, the channel closes, the partition moves).
func (c *Consumer) Process(ctx context.Context, m *Message, s Settler) (Result, error) {
	start := time.Now()
	if c.obs != nil {
		ctx = c.obs.MessageStart(ctx, c.name, m)
	}
	res := c.handle(ctx, m)
	var err error
	switch {
	case ctx.Err() != nil && res.Action == Retry:
		err = ctx.Err() // shutting down: the broker redelivers
	default:
		err = c.settle(ctx, s, res)
	}
	if c.obs != nil {
		c.obs.MessageEnd(ctx, Event{Consumer: c.name, Deliveries: m.deliveries(), Result: res,
			SettleErr: err, Duration: time.Since(start)})
	}
	return res, err
}

// handle runs the handler under m's key and decides the action.
func (c *Consumer) handle(ctx context.Context, m *Message) Result { return c.handleOn(ctx, c.db, m) }

// handleOn is handle on db: the consumer's database, or a batch's
// transaction (ProcessBatch).
func (c *Consumer) handleOn(ctx context.Context, db idem.Beginner, m *Message) Result {
	key, err := m.key()
	if err != nil {
		return Result{Action: DeadLetter, Outcome: idem.OutcomeInvalid, Err: err}
	}
	ctx = idem.ContextWithScope(ctx, c.scope)
	_, outcome, err := idem.Run(ctx, db, key, idem.HashBytes(m.Payload),
		func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			return struct{}{}, c.handler(ctx, tx, m)
		})
	res := Result{Outcome: outcome, Err: err}
	switch outcome {
	case idem.OutcomeExecuted, idem.OutcomeReplayed, idem.OutcomeRefused:
		res.Action = Ack
	case idem.OutcomeInProgress:
		res.Action, res.Delay = Retry, c.waitFor
	case idem.OutcomeUnknown:
		// The next delivery learns the outcome: a replay if COMMIT took.
		res.Action, res.Delay = Retry, c.backoff(1)
	case idem.OutcomeMismatch, idem.OutcomeInvalid:
		res.Action = DeadLetter
	default:
		if n := m.deliveries(); n < c.max || ctx.Err() != nil {
			res.Action, res.Delay = Retry, c.backoff(n)
		} else {
			res.Action, res.Err = DeadLetter, fmt.Errorf("%w after %d deliveries: %w", ErrDeliveryLimit, n, err)
		}
	}
	return res
}

// settle tells the broker res's action through s, once the transaction
// answered. It does so even when ctx has ended meanwhile, or the message
// would come back only to be dropped as a duplicate.
func (c *Consumer) settle(ctx context.Context, s Settler, res Result) error {
	if ctx.Err() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	switch res.Action {
	case Ack:
		return s.Ack(ctx)
	case Retry:
		return s.Retry(ctx, res.Delay)
	default:
		return s.DeadLetter(ctx, res.Err)
	}
}
