package payments

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"
)

// The default rate limit of POST /payments, per account (Config.PaymentRate
// and Config.PaymentBurst): 5 payments a second, sustained, in bursts of
// up to 10. A person paying, or a shop's checkout, stays below it; a
// script filling the key table is held to 5 keys a second: 432,000 keys,
// about 0.7 GB of key table a day per account at the 1,675 bytes a key
// measured with 255-byte keys (docs/SECURITY.md has the figure).
const (
	DefaultPaymentRate  rate.Limit = 5
	DefaultPaymentBurst int        = 10
)

// minLimiters is the size below which perAccount never sweeps.
const minLimiters = 1024

// perAccount is a token bucket (golang.org/x/time/rate) per account. It
// is safe for concurrent use.
type perAccount struct {
	rate  rate.Limit // rate.Inf: no limit, and no buckets
	burst int

	mu       sync.Mutex
	limiters map[uuid.UUID]*rate.Limiter
	// sweepAt is the number of buckets at which the idle ones are
	// dropped: twice as many as the last sweep kept, so sweeps cost O(1)
	// per new bucket.
	sweepAt int
}

// newPerAccount returns the limits of r per second in bursts of burst,
// where 0 means the default.
func newPerAccount(r rate.Limit, burst int) (*perAccount, error) {
	if r < 0 || burst < 0 {
		return nil, fmt.Errorf("payments: a negative rate limit (%v per second, burst %d)", r, burst)
	}
	if r == 0 {
		r = DefaultPaymentRate
	}
	if burst == 0 {
		burst = DefaultPaymentBurst
	}
	return &perAccount{rate: r, burst: burst, limiters: map[uuid.UUID]*rate.Limiter{}, sweepAt: minLimiters}, nil
}

// wait takes one token from account's bucket and returns 0, or, if the
// bucket is empty, takes nothing and returns how long until a token is
// there.
func (p *perAccount) wait(account uuid.UUID, now time.Time) time.Duration {
	if p.rate == rate.Inf {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	lim := p.limiters[account]
	if lim == nil {
		if len(p.limiters) >= p.sweepAt {
			p.sweep(now)
		}
		lim = rate.NewLimiter(p.rate, p.burst)
		p.limiters[account] = lim
	}
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		// Refused: the token is given back, so that a client that keeps
		// sending while refused is not refused for longer.
		r.CancelAt(now)
		return d
	}
	return 0
}

// sweep drops the buckets that are full again. A full bucket is the state
// a new one starts in, so forgetting it changes no answer; what stays are
// the accounts active within the last burst/rate seconds.
func (p *perAccount) sweep(now time.Time) {
	for account, lim := range p.limiters {
		if lim.TokensAt(now) >= float64(p.burst) {
			delete(p.limiters, account)
		}
	}
	p.sweepAt = max(2*len(p.limiters), minLimiters)
}

// limit runs next only within the account's rate limit (requireAccount, in
// front, has put the account in the context). Other requests are answered
// 429 with Retry-After, in whole seconds: before idemhttp, so a refused
// request never reaches the key table.
func (s *server) limit(limits *perAccount, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		account, ok := accountFrom(r.Context())
		if !ok {
			// A wiring mistake: without an account there is no bucket.
			s.internal(r, errNoCredentials).write(w)
			return
		}
		if d := limits.wait(account, time.Now()); d > 0 {
			rep := fail(http.StatusTooManyRequests, ProblemTooManyRequests, fmt.Sprintf(
				"this account sends more than %v payments a second (bursts of %d); retry after Retry-After seconds with the same Idempotency-Key",
				float64(limits.rate), limits.burst))
			rep.header = http.Header{"Retry-After": {strconv.Itoa(int(math.Ceil(d.Seconds())))}}
			rep.write(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}
