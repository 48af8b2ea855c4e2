package idemclient

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
)

// The defaults of a Policy's fields.
const (
	DefaultMaxAttempts   = 5
	DefaultMinBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff    = 5 * time.Second
	DefaultMaxRetryAfter = time.Minute
)

// ErrInvalidPolicy is wrapped by the error of a Policy that Validate
// refuses, and so by every constructor given one.
var ErrInvalidPolicy = errors.New("idemclient: invalid policy")

// Policy is how a client retries: how often, how long it waits, and what
// keys it makes. The zero value, like a nil *Policy, means the defaults each
// field states. A Policy is checked once, by the constructor it is given
// to (NewTransport, and those of the subpackages), and must not be changed
// afterwards.
type Policy struct {
	// MaxAttempts bounds the attempts of one logical request, the first
	// included: 1 means no retry. Defaults to DefaultMaxAttempts (5).
	MaxAttempts int

	// MinBackoff is the wait before the first retry; each later retry
	// doubles it, up to MaxBackoff, and each wait is drawn at random from
	// its upper half (jitter), so that clients that failed together do not
	// retry together. Defaults to DefaultMinBackoff (100ms).
	MinBackoff time.Duration

	// MaxBackoff caps the doubling of MinBackoff. A server's Retry-After
	// (or gRPC RetryInfo) that asks for a longer wait wins over it.
	// Defaults to DefaultMaxBackoff (5s).
	MaxBackoff time.Duration

	// MaxRetryAfter is the longest wait a server may ask for: an answer
	// whose Retry-After (or RetryInfo delay) is longer ends the retries at
	// once, and the caller receives that answer, as it does when the wait
	// would pass ctx's deadline. Defaults to DefaultMaxRetryAfter (1m).
	MaxRetryAfter time.Duration

	// UUIDVersion is the version of the UUIDs made as keys: 4 (random) or 7
	// (time-ordered, which keeps a server's key index compact). Defaults
	// to 4.
	UUIDVersion int
}

// Validate reports whether p can be used: no negative duration or count,
// MinBackoff not above MaxBackoff, and UUIDVersion 0, 4 or 7. Its error
// wraps ErrInvalidPolicy. A nil *Policy is valid.
func (p *Policy) Validate() error {
	if p == nil {
		return nil
	}
	r := p.resolved()
	switch {
	case p.MaxAttempts < 0:
		return fmt.Errorf("%w: MaxAttempts %d is negative", ErrInvalidPolicy, p.MaxAttempts)
	case p.MinBackoff < 0, p.MaxBackoff < 0, p.MaxRetryAfter < 0:
		return fmt.Errorf("%w: a negative duration (MinBackoff %v, MaxBackoff %v, MaxRetryAfter %v)",
			ErrInvalidPolicy, p.MinBackoff, p.MaxBackoff, p.MaxRetryAfter)
	case r.MinBackoff > r.MaxBackoff:
		return fmt.Errorf("%w: MinBackoff %v is above MaxBackoff %v", ErrInvalidPolicy, r.MinBackoff, r.MaxBackoff)
	case p.UUIDVersion != 0 && p.UUIDVersion != 4 && p.UUIDVersion != 7:
		return fmt.Errorf("%w: UUIDVersion %d is neither 4 nor 7", ErrInvalidPolicy, p.UUIDVersion)
	}
	return nil
}

// resolved returns p with its defaults filled in.
func (p *Policy) resolved() Policy {
	var r Policy
	if p != nil {
		r = *p
	}
	if r.MaxAttempts == 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.MinBackoff == 0 {
		r.MinBackoff = DefaultMinBackoff
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = DefaultMaxBackoff
	}
	if r.MaxRetryAfter == 0 {
		r.MaxRetryAfter = DefaultMaxRetryAfter
	}
	return r
}

// Attempts returns the bound on the attempts of one logical request:
// MaxAttempts, or its default.
func (p *Policy) Attempts() int { return p.resolved().MaxAttempts }

// NewKey returns a new idempotency key: a UUID of UUIDVersion, in its
// canonical form. Make one per logical operation, never one per attempt.
func (p *Policy) NewKey() (string, error) {
	var (
		id  uuid.UUID
		err error
	)
	if p != nil && p.UUIDVersion == 7 {
		id, err = uuid.NewV7()
	} else {
		id, err = uuid.NewRandom()
	}
	if err != nil {
		return "", fmt.Errorf("idemclient: make a key: %w", err)
	}
	return id.String(), nil
}

// Next decides on the retry after attempts attempts (1 after the first)
// whose last answer asked, through Retry-After or a gRPC RetryInfo, for a
// wait of hint (0 when it did not): it returns the wait before the next
// attempt and true, or false when no attempt is left, when hint is over
// MaxRetryAfter, or when the wait would end past ctx's deadline. The wait
// is the jittered exponential backoff, or hint when hint is longer. Next
// does not classify the answer: call it only for one that may be retried.
func (p *Policy) Next(ctx context.Context, attempts int, hint time.Duration) (time.Duration, bool) {
	r := p.resolved()
	if attempts >= r.MaxAttempts || hint > r.MaxRetryAfter {
		return 0, false
	}
	wait := r.backoff(attempts)
	if hint > wait {
		wait = hint
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
		return 0, false
	}
	return wait, true
}

// Backoff returns the jittered exponential wait before retry n (1 for the
// first retry), ignoring any hint of the server's: a random duration in
// the upper half of MinBackoff·2^(n-1), capped at MaxBackoff.
func (p *Policy) Backoff(n int) time.Duration { return p.resolved().backoff(n) }

func (r Policy) backoff(n int) time.Duration {
	d := r.MinBackoff
	for i := 1; i < n && d < r.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.MaxBackoff)
	return d/2 + rand.N(d/2+1)
}
