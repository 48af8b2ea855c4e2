package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/dbtx"
)

// Status is the state of a key's row.
type Status string

// The states of a key, as the status column holds them.
const (
	// StatusInProgress: a transaction holds the key right now.
	StatusInProgress Status = "in_progress"
	// StatusCompleted: the result is stored and replayed until ExpiresAt.
	StatusCompleted Status = "completed"
	// StatusRefused: a business refusal is stored and replayed until
	// ExpiresAt.
	StatusRefused Status = "refused"
	// StatusUnfinished: an operation made of steps (Operation) has begun
	// and not yet stored its answer. It holds the key: Do gets
	// ErrInProgress, and the sweeper never removes it.
	StatusUnfinished Status = "unfinished"
)

// A Record is what the table holds for a key, for support staff and
// operators: Client.Lookup returns it.
type Record struct {
	Scope  string
	Key    string
	Status Status
	// RequestHash is the fingerprint of the request that claimed the key.
	// Empty while a new key is in progress (its row is not visible yet).
	RequestHash string
	// CreatedAt is when the key was claimed; zero while a new key is in
	// progress.
	CreatedAt time.Time
	// CompletedAt is when the outcome was stored; zero while in progress.
	CompletedAt time.Time
	// ExpiresAt is when the key stops being replayed: CompletedAt plus the
	// TTL. It may be in the past for a key the sweeper has not deleted yet.
	// Zero while in progress.
	ExpiresAt time.Time
	// Result is the encoded result (JSON, or the type's MarshalBinary
	// form), opened if the Client has a Sealer: decode it with
	// DecodeResult. Nil when Sealed.
	Result []byte
	// Refusal is the stored business refusal, for StatusRefused. Nil when
	// Sealed.
	Refusal *Refusal
	// Sealed reports that the row was stored sealed (Config.Sealer) and the
	// Client that looked it up has no Sealer to open it: Status, the hash
	// and the times are the row's, but Result and Refusal are not known.
	// A sealed row is not corrupt, and a retry with the Sealer replays it:
	// look it up through a Client with the same Sealer to read it. (A
	// Client with a Sealer opens sealed rows, and reports one it cannot
	// open as ErrCorruptRecord.)
	Sealed bool
}

// sealedRefusal is what the refusal column of a sealed row holds: a JSON
// string, which no plain row's refusal (an object with a code, or NULL)
// can be, so that a reader without the Sealer can tell a sealed row from a
// plain or corrupt one. The refusal itself is in the sealed envelope.
const sealedRefusal = `"sealed"`

// isSealed reports whether a row's columns say it was stored sealed: its
// refusal column holds sealedRefusal.
func isSealed(refusal []byte) bool {
	return string(refusal) == sealedRefusal
}

// Expired reports whether the key no longer replays at time now.
func (r Record) Expired(now time.Time) bool {
	return r.Status != StatusInProgress && r.Status != StatusUnfinished && !now.Before(r.ExpiresAt)
}

// DecodeResult decodes a record's Result as the T that Do stored.
func DecodeResult[T any](r Record) (T, error) {
	v, err := decode[T](r.Result)
	if err != nil {
		return v, fmt.Errorf("%w: %w", ErrCorruptRecord, err)
	}
	return v, nil
}

// Lookup returns what the table holds for scope and key (the scope as
// stored: for Wrap's keys, see Wrap), whether it still replays or has
// expired and awaits the sweeper; a Record with StatusInProgress when a
// transaction holds the key right now, or with StatusUnfinished for an
// Operation that has begun and not finished (no Result yet); or
// ErrNotFound. A sealed row is
// opened with the Client's Sealer (an error wraps ErrCorruptRecord); a
// Client without a Sealer returns it with Sealed set and neither Result nor
// Refusal. It takes no lock that outlives the statement and writes nothing.
// A missing key table is an error that says to apply the schema.
func (c *Client) Lookup(ctx context.Context, scope, key string) (Record, error) {
	if err := ValidateScope(scope); err != nil && !isWrapScope(scope) {
		return Record{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Record{}, err
	}
	var (
		busy               bool
		hash, status       *string
		response, refusal  []byte
		created, completed *time.Time
		expires            *time.Time
	)
	err := c.query(ctx, func(q querier) error {
		stmts, err := resolveQuerier(ctx, q, c.base.stmts)
		if err != nil {
			return err
		}
		return q.QueryRow(ctx, stmts.record, scope, key, lockKey(scope, key)).
			Scan(&busy, &hash, &status, &response, &refusal, &created, &completed, &expires)
	})
	if err != nil {
		return Record{}, tableError(c.base.table, "look up key", err)
	}
	rec := Record{Scope: scope, Key: key}
	if busy {
		rec.Status = StatusInProgress
		return rec, nil
	}
	if hash == nil {
		return Record{}, ErrNotFound
	}
	rec.Status, rec.RequestHash = Status(*status), *hash
	rec.CreatedAt = *created
	if completed != nil {
		rec.CompletedAt, rec.ExpiresAt = *completed, *expires
	}
	if rec.Status == StatusInProgress || rec.Status == StatusUnfinished {
		// An unfinished operation has no answer yet; an 'in_progress' row
		// was committed by misuse. Neither holds anything to open.
		return rec, nil
	}
	if c.base.sealer == nil && isSealed(refusal) {
		rec.Sealed = true
		return rec, nil
	}
	data, ref, err := open(ctx, &c.base, scope, key, &storedRow{requestHash: *hash, status: *status, response: response, refusal: refusal})
	if err != nil {
		return rec, err
	}
	rec.Result, rec.Refusal = data, ref
	return rec, nil
}

// Forget deletes the key, so that the next call with it runs fn again: for
// a deliberate reset, such as after a refund. It reports whether there was
// a row to delete. A key in progress (a call's transaction, or an
// operation's database step, holds it) is not touched: Forget returns
// ErrInProgress at once, without waiting. So it does for a key whose row
// changed while Forget ran (a claim or an operation's step committed):
// look again. An unfinished operation between its steps is forgotten with
// its state. A missing key table is an error that says to apply the
// schema. A connection lost before the delete's reply is an error wrapping
// ErrOutcomeUnknown: the key may or may not be forgotten.
//
// The operation the key recorded is not undone: a retry after Forget does
// it again (charges again). A row that will not replay (ErrCorruptRecord)
// still records that the operation ran, so forget it only once its effect
// is known to be undone. A row that Lookup reports Sealed is not corrupt:
// it replays through a Client with the Sealer that stored it.
func (c *Client) Forget(ctx context.Context, scope, key string) (bool, error) {
	if err := ValidateScope(scope); err != nil && !isWrapScope(scope) {
		return false, err
	}
	if err := ValidateKey(key); err != nil {
		return false, err
	}
	var (
		free    bool
		deleted int64
	)
	err := c.query(ctx, func(q querier) error {
		return q.QueryRow(ctx, c.base.stmts.forget, scope, key, lockKey(scope, key)).Scan(&free, &deleted)
	})
	if err != nil {
		// The delete commits on its own: without its reply, whether the key
		// was forgotten is unknown (Lookup tells).
		if _, inTx := c.db.(pgx.Tx); !inTx && dbtx.CommitOutcomeUnknown(err) {
			return false, fmt.Errorf("%w: forget key: %w", ErrOutcomeUnknown, err)
		}
		return false, tableError(c.base.table, "forget key", err)
	}
	if !free {
		return false, ErrInProgress
	}
	return deleted > 0, nil
}

func isWrapScope(scope string) bool {
	return len(scope) > 1 && scope[0] == '\x1f' && len(scope) <= MaxKeyLen
}

// query runs f on the Client's database, in a transaction of its own if the
// database cannot query directly.
func (c *Client) query(ctx context.Context, f func(querier) error) error {
	if q, ok := c.db.(querier); ok {
		return f(q)
	}
	return pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error { return f(tx) })
}
