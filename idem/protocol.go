package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A session is one attempt's transaction on one kind of database: the
// pipelined path on a connection (pipeline.go) or the path through Begin,
// for an outer transaction or any other Beginner (nested.go). The protocol
// below is written once against it.
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

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// attempt runs the protocol once on a session fitting db.
func attempt[T any, W work[T]](ctx context.Context, db Beginner, c *call, fn W) (T, Outcome, error) {
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
		return protocol[T](ctx, &pipeline{conn: conn.Conn()}, c, fn)
	case *pgxpool.Conn:
		return protocol[T](ctx, &pipeline{conn: d.Conn()}, c, fn)
	case *pgx.Conn:
		return protocol[T](ctx, &pipeline{conn: d}, c, fn)
	default:
		return protocol[T](ctx, &nested{db: db}, c, fn)
	}
}

// protocol is the transaction protocol: claim the key, or settle a call
// that could not; run fn in the transaction; store its outcome and commit,
// or roll everything back.
func protocol[T any, W work[T]](ctx context.Context, s session, c *call, fn W) (T, Outcome, error) {
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
			return zero, OutcomeFailed, fmt.Errorf("%w (fn returned: %v)", ErrTxEnded, fnErr)
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

// claim is what the claim statement answered.
type claim struct {
	locked  *bool // nil: a live row made locking needless
	claimed bool
	rec     *record
}

// lostRace turns a claim that the partitioned layout's second look undid
// (assert_claimed_partitioned.sql found a live row committed just before
// the lock) into what it is: a key held and released by another call, whose
// row the lookup after this attempt will find.
func (cl *claim) lostRace() {
	cl.claimed, cl.rec = false, nil
}

// record is a live row read back for a replay.
type record struct {
	requestHash string
	status      string
	response    []byte
	refusal     []byte
}

// claimTargets are the destinations the claim's row is scanned into.
type claimTargets struct {
	locked            *bool
	claimed           bool
	hash, status      *string
	response, refusal []byte
	createdAt         *time.Time
}

func (c *call) scanClaim(row pgx.Row) (claim, error) {
	t := &c.scan
	*t = claimTargets{}
	var err error
	if c.deferred {
		err = row.Scan(&t.locked, &t.hash, &t.status, &t.response, &t.refusal)
		// Holding the lock is a claim unless assert_deferred finds the race
		// lost (claim.lostRace).
		t.claimed = err == nil && t.locked != nil && *t.locked
	} else if c.stmts.isPartitioned {
		err = row.Scan(&t.locked, &t.claimed, &t.hash, &t.status, &t.response, &t.refusal, &t.createdAt)
		if err == nil && t.claimed && t.createdAt != nil {
			c.createdAt = *t.createdAt
		}
	} else {
		err = row.Scan(&t.locked, &t.claimed, &t.hash, &t.status, &t.response, &t.refusal)
	}
	if err != nil {
		return claim{}, err
	}
	cl := claim{locked: t.locked, claimed: t.claimed}
	if t.hash != nil {
		cl.rec = &record{requestHash: *t.hash, status: *t.status, response: t.response, refusal: t.refusal}
	}
	return cl, nil
}

// finish is the outcome to store, prepared before the last round trip.
type finish struct {
	status   string
	response []byte
	// refusal is the jsonb parameter: a string, or nil for NULL. A []byte
	// would travel as bytea in the exec and simple-protocol modes (the
	// modes for PgBouncer), and the server would reject it as JSON.
	refusal any
	refused bool
}

// finishing decides what fn's return means. A nil error means store fin;
// stored is the value as every replay will see it. An error means roll back
// and return that error.
func finishing[T any](ctx context.Context, c *call, v T, fnErr error) (fin finish, stored T, err error) {
	var refusalJSON []byte
	if fnErr != nil {
		var refusal *Refusal
		if !errors.As(fnErr, &refusal) || refusal == nil {
			return fin, stored, fnErr
		}
		if refusal.Code == "" {
			return fin, stored, fmt.Errorf("idem: a Refusal needs a Code: %w", fnErr)
		}
		if refusalJSON, err = refusal.marshal(); err != nil {
			return fin, stored, fmt.Errorf("idem: encode refusal: %w", err)
		}
		fin.refused, fin.status = true, statusRefused
	} else {
		fin.status = statusCompleted
	}
	data, err := encode(v)
	if err != nil {
		return fin, stored, fmt.Errorf("idem: encode result: %w", err)
	}
	if len(data) > c.s.maxResult {
		return fin, stored, fmt.Errorf("%w: %d bytes encoded, more than %d (Config.MaxResultBytes)", ErrResultTooLarge, len(data), c.s.maxResult)
	}
	if stored, err = storedForm(v, data); err != nil {
		return fin, stored, err
	}
	if c.s.sealer != nil {
		env := envelope{status: fin.status, requestHash: c.reqHash, refusal: refusalJSON, value: data}
		sealed, err := c.s.sealer.Seal(ctx, c.scope, c.key, env.marshal(c.scope, c.key))
		if err != nil {
			return fin, stored, fmt.Errorf("idem: seal result: %w", err)
		}
		fin.response = sealed
		return fin, stored, nil
	}
	if refusalJSON != nil {
		fin.refusal = string(refusalJSON)
	}
	if data == nil {
		data = []byte{} // NULL is reserved for rows that hold no result yet
	}
	fin.response = data
	return fin, stored, nil
}

// The status column's values.
const (
	statusInProgress = "in_progress"
	statusCompleted  = "completed"
	statusRefused    = "refused"
)
