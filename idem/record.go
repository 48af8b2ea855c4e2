package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Status is the state of a key's row.
type Status string

// The states of a key.
const (
	// StatusInProgress: a transaction holds the key right now.
	StatusInProgress Status = statusInProgress
	// StatusCompleted: the result is stored and replayed until ExpiresAt.
	StatusCompleted Status = statusCompleted
	// StatusRefused: a business refusal is stored and replayed until
	// ExpiresAt.
	StatusRefused Status = statusRefused
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
	// DecodeResult.
	Result []byte
	// Refusal is the stored business refusal, for StatusRefused.
	Refusal *Refusal
}

// Expired reports whether the key no longer replays at time now.
func (r Record) Expired(now time.Time) bool {
	return r.Status != StatusInProgress && !now.Before(r.ExpiresAt)
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
// transaction holds the key right now; or ErrNotFound. A sealed row is
// opened with the Client's Sealer (an error wraps ErrCorruptRecord). It
// takes no lock that outlives the statement and writes nothing.
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
		return q.QueryRow(ctx, c.base.stmts.record, scope, key).
			Scan(&busy, &hash, &status, &response, &refusal, &created, &completed, &expires)
	})
	if err != nil {
		return Record{}, fmt.Errorf("idem: look up key: %w", err)
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
	if rec.Status == StatusInProgress {
		return rec, nil // committed by misuse; it holds nothing to open
	}
	data, ref, err := open(ctx, &c.base, scope, key, &record{requestHash: *hash, status: *status, response: response, refusal: refusal})
	if err != nil {
		return rec, err
	}
	rec.Result, rec.Refusal = data, ref
	return rec, nil
}

// Forget deletes the key, so that the next call with it runs fn again: for
// a deliberate reset, such as after a refund, or to clear a corrupt record.
// It reports whether there was a row to delete. A key in progress is not
// touched: Forget returns ErrInProgress at once.
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
		return q.QueryRow(ctx, c.base.stmts.forget, scope, key).Scan(&free, &deleted)
	})
	if err != nil {
		return false, fmt.Errorf("idem: forget key: %w", err)
	}
	if !free {
		return false, ErrInProgress
	}
	return deleted > 0, nil
}

// WrapScope returns the scope that Wrap stores operation's keys under for a
// caller scope, for Lookup and Forget.
func WrapScope(operation, scope string) (string, error) {
	if err := validateText(ErrInvalidOption, operation); err != nil || operation == "" {
		return "", inputError(ErrInvalidOption, "invalid operation %q", operation)
	}
	if err := ValidateScope(scope); err != nil {
		return "", err
	}
	return wrapScope(operation, scope)
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
