package idemclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemhq/idem/idemclient/internal/header"
)

// ErrBodyNotReplayable is returned, before anything is sent, for a request
// with a body but no GetBody: its body could be sent once, and a retry
// with the same key but another (empty) body would be answered as a key
// reused for another request. http.NewRequest sets GetBody for bodies of
// type *bytes.Buffer, *bytes.Reader and *strings.Reader.
var ErrBodyNotReplayable = errors.New("idemclient: the request has a body but no GetBody, so a retry could not send it again")

// A RetryError is what a request through a Transport ends with when no
// attempt was answered: Err is the last attempt's error (a refused or
// reset connection, a timeout), or ctx's error joined to it when ctx ended
// during a wait. The Result says which key was sent how often. The
// outcome on the server is unknown: retry later with Result.Key
// (ContextWithKey), never with a new key.
type RetryError struct {
	Result
	Err error
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("idemclient: no answer after %d attempt(s) with key %s: %v", e.Attempts, e.Key, e.Err)
}

func (e *RetryError) Unwrap() error { return e.Err }

// Result is what the retries of one logical request came to.
type Result struct {
	// Key is the Idempotency-Key header sent with every attempt, as it was
	// sent; "" for a request that carried none (a method other than POST
	// and PATCH, without a key of the caller's).
	Key string
	// Attempts counts the requests sent, the first included. A request
	// net/http re-sent by itself on a kept-alive connection that broke is
	// not counted (see the package documentation).
	Attempts int
	// Replayed reports whether the final answer carried
	// Idempotent-Replayed: true: the server answered from the result it
	// stored for the key, without running the operation again.
	Replayed bool
}

type resultCtx struct{}

// ResultOf returns the Result of resp, an answer that a Transport returned
// (through an http.Client too), and false for any other answer.
func ResultOf(resp *http.Response) (Result, bool) {
	if resp == nil || resp.Request == nil {
		return Result{}, false
	}
	r, ok := resp.Request.Context().Value(resultCtx{}).(Result)
	return r, ok
}

// Transport is an http.RoundTripper that retries a request with the same
// Idempotency-Key and the same body as its Policy says. The package
// documentation lists what it retries. It is safe for concurrent use.
type Transport struct {
	next   http.RoundTripper
	policy Policy
}

// NewTransport returns a Transport that sends through next
// (http.DefaultTransport when nil) as p says (nil: the defaults). An
// invalid p is an error wrapping ErrInvalidPolicy.
func NewTransport(next http.RoundTripper, p *Policy) (*Transport, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if next == nil {
		next = http.DefaultTransport
	}
	return &Transport{next: next, policy: p.resolved()}, nil
}

// NewClient returns an *http.Client whose transport is NewTransport(next,
// p). Its Timeout is zero: bound a logical request, retries and waits
// included, with its context's deadline.
func NewClient(next http.RoundTripper, p *Policy) (*http.Client, error) {
	t, err := NewTransport(next, p)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// RoundTrip sends req until an answer that is not to be retried, the
// attempts are spent, or the next wait would pass the deadline of req's
// context, and returns the last answer, whatever its status, with its
// Result (ResultOf). When no attempt was answered, the error is a
// *RetryError. A request with a body but no GetBody is refused with
// ErrBodyNotReplayable before anything is sent.
//
// Every attempt carries the key Policy.RequestKey returns for req: the
// caller's, or for a POST or PATCH without one a key of the context's or
// a new one. Requests of other methods are idempotent by definition: they
// are retried with the caller's key if they carry one, and without
// otherwise.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	closeBody := func() {
		if req.Body != nil {
			_ = req.Body.Close()
		}
	}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		closeBody()
		return nil, fmt.Errorf("%w: %s %s", ErrBodyNotReplayable, req.Method, req.URL.Redacted())
	}
	ctx := req.Context()
	key, err := t.policy.RequestKey(req)
	if err != nil {
		closeBody()
		return nil, err
	}
	res := Result{Key: key}
	for {
		res.Attempts++
		attempt := req.Clone(ctx)
		if res.Key != "" {
			attempt.Header.Set(HeaderKey, res.Key)
		}
		if res.Attempts > 1 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, &RetryError{Result: res, Err: fmt.Errorf("GetBody: %w", err)}
			}
			attempt.Body = body
		}
		resp, err := t.next.RoundTrip(attempt)
		if ctx.Err() != nil || !Retryable(resp, err) {
			return t.finish(attempt, res, resp, err)
		}
		wait, ok := t.policy.Next(ctx, res.Attempts, header.RetryAfter(resp, time.Now()))
		if !ok {
			return t.finish(attempt, res, resp, err)
		}
		if resp != nil {
			// Read a little of the answer so that its connection can be
			// used again, then let it go.
			_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
			_ = resp.Body.Close()
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, &RetryError{Result: res, Err: errors.Join(ctx.Err(), err)}
		case <-timer.C:
		}
	}
}

// finish returns the last attempt's answer with its Result, or its error
// as a *RetryError.
func (t *Transport) finish(attempt *http.Request, res Result, resp *http.Response, err error) (*http.Response, error) {
	if err != nil {
		return nil, &RetryError{Result: res, Err: err}
	}
	res.Replayed = resp.Header.Get(HeaderReplayed) == "true"
	req := resp.Request
	if req == nil {
		req = attempt
	}
	resp.Request = req.WithContext(context.WithValue(req.Context(), resultCtx{}, res))
	return resp, nil
}

// Retryable reports whether an attempt that ended with resp or err may be
// sent again with the same key, as the package documentation lists:
//
//   - an error: yes, unless it is a context's (the caller's deadline or
//     cancellation) or a TLS certificate's, which no retry cures;
//   - 409 Conflict (the key is in use by a request still running), 425 Too
//     Early, 429 Too Many Requests, 500 Internal Server Error, 502 Bad
//     Gateway, 503 Service Unavailable (idem's outcome-unknown answer
//     included) and 504 Gateway Timeout: yes. A 500 is retried because
//     the key makes it safe and some servers mean it as "retry to
//     continue" (idemhttp's operation handler answers 500 when a step
//     failed, and a retry with the key resumes the operation); where it is
//     a failure no retry cures, the attempts are bounded;
//   - any other status: no. A 422 (the key was used for another request,
//     in the draft's words), a 400 or any other 4xx is the caller's bug or
//     a refusal; a 501 is never cured.
func Retryable(resp *http.Response, err error) bool {
	if err != nil {
		var (
			verify  *tls.CertificateVerificationError
			unknown x509.UnknownAuthorityError
			host    x509.HostnameError
			invalid x509.CertificateInvalidError
		)
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
			!errors.As(err, &verify) && !errors.As(err, &unknown) && !errors.As(err, &host) && !errors.As(err, &invalid)
	}
	if resp == nil {
		return false
	}
	switch resp.StatusCode {
	case http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}
