// Package retryablehttp makes a github.com/hashicorp/go-retryablehttp
// client retry as an idemclient.Policy says: one Idempotency-Key per
// logical request, kept across every attempt, and only the answers that
// are safe to retry retried (idemclient.Retryable), after the answer's
// Retry-After when it asks for longer than the backoff.
//
// go-retryablehttp by itself retries a POST without any key, retries 429
// and every 5xx but 501, never a 409 or 425, and gives up with an error
// that drops the server's last answer. Configure
// changes all of that:
//
//	c := retryablehttp.NewClient() // github.com/hashicorp/go-retryablehttp
//	if err := idemretryablehttp.Configure(c, nil); err != nil { ... }
//	resp, err := c.Do(req) // or c.StandardClient()
//
// Where idemclient.Transport stops early to return the last answer (the
// next wait would pass the context's deadline), go-retryablehttp's loop,
// which never tells its hooks the deadline of a plain backoff, ends with
// the context's error instead when the deadline passes during a wait; an
// answer whose Retry-After alone would pass the deadline is returned at
// once, as with the Transport.
package retryablehttp

import (
	"context"
	"fmt"
	"net/http"
	"time"

	rhttp "github.com/hashicorp/go-retryablehttp"

	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/idemclient/internal/header"
)

// Configure sets c's RetryMax (Policy.Attempts, less the first attempt),
// CheckRetry, Backoff and ErrorHandler from p (nil: the defaults), and
// wraps its RequestLogHook, whose earlier value still runs, with one that
// gives a POST or PATCH without an Idempotency-Key the key of its context
// (idemclient.ContextWithKey) or a new one, before its first attempt:
// go-retryablehttp sends every attempt with the same headers, so that key
// is kept. An invalid p is an error wrapping idemclient.ErrInvalidPolicy,
// and c is then left as it was.
//
// Its bodies are go-retryablehttp's own: they are read once and sent
// again on every attempt.
func Configure(c *rhttp.Client, p *idemclient.Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	c.RetryMax = p.Attempts() - 1
	c.CheckRetry = CheckRetry(p)
	c.Backoff = Backoff(p)
	c.ErrorHandler = errorHandler
	c.RequestLogHook = KeyHook(p, c.RequestLogHook)
	return nil
}

// CheckRetry returns a go-retryablehttp CheckRetry that retries what
// idemclient.Retryable says may be retried, unless ctx is done or the
// answer's Retry-After is over p.MaxRetryAfter or past ctx's deadline,
// when the answer is returned at once.
func CheckRetry(p *idemclient.Policy) rhttp.CheckRetry {
	return func(ctx context.Context, resp *http.Response, err error) (bool, error) {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if !idemclient.Retryable(resp, err) {
			return false, nil
		}
		// Next with the first attempt's count decides only on the hint:
		// go-retryablehttp bounds the attempts itself.
		if hint := header.RetryAfter(resp, time.Now()); hint > 0 {
			if _, ok := p.Next(ctx, 0, hint); !ok {
				return false, nil
			}
		}
		return true, nil
	}
}

// Backoff returns a go-retryablehttp Backoff that waits as p says before
// retry attemptNum+1: its jittered exponential backoff (the client's
// RetryWaitMin and RetryWaitMax are not used), or the answer's
// Retry-After when that is longer.
func Backoff(p *idemclient.Policy) rhttp.Backoff {
	return func(_, _ time.Duration, attemptNum int, resp *http.Response) time.Duration {
		return max(p.Backoff(attemptNum+1), header.RetryAfter(resp, time.Now()))
	}
}

// KeyHook returns a go-retryablehttp RequestLogHook that sets, before the
// first attempt, the Idempotency-Key p.RequestKey returns for the request
// (a POST or PATCH without a key of its own gets the context's or a new
// one), and then calls next (if not nil). The later attempts carry the
// same header.
func KeyHook(p *idemclient.Policy, next rhttp.RequestLogHook) rhttp.RequestLogHook {
	return func(l rhttp.Logger, req *http.Request, attempt int) {
		if attempt == 0 {
			// uuid's generators read crypto/rand, which does not fail.
			if key, _ := p.RequestKey(req); key != "" {
				req.Header.Set(idemclient.HeaderKey, key)
			}
		}
		if next != nil {
			next(l, req, attempt)
		}
	}
}

// errorHandler returns the last answer when there is one, so that the
// caller receives the server's 503 or 409 rather than only an error; and
// an error that counts the attempts otherwise.
func errorHandler(resp *http.Response, err error, attempts int) (*http.Response, error) {
	if resp != nil && err == nil {
		return resp, nil
	}
	if resp != nil {
		_ = resp.Body.Close()
	}
	return nil, fmt.Errorf("idemclient/retryablehttp: no answer after %d attempt(s): %w", attempts, err)
}
