package idemhttp

import (
	"net/http"
	"time"

	"github.com/idemhq/idem/idem"
)

// An Option configures the middleware New returns. A middleware without
// options uses the defaults each option states.
type Option func(*config)

type config struct {
	methods      map[string]bool
	required     bool
	scope        func(*http.Request) (string, error)
	fingerprint  func(r *http.Request, body []byte) (string, error)
	fpHeaders    []string
	maxBody      int64
	replayHeader []string
	storeStatus  func(status int) bool
	retryAfter   time.Duration
	idemOpts     []idem.Option
}

// DefaultMaxBodyBytes is the largest request body the middleware buffers
// when WithMaxBodyBytes is not given: 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// DefaultRetryAfter is the Retry-After sent with 409 and 503 answers when
// WithRetryAfter is not given.
const DefaultRetryAfter = time.Second

func newConfig(opts []Option) config {
	c := config{
		methods:     map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		maxBody:     DefaultMaxBodyBytes,
		storeStatus: DefaultStoreStatus,
		retryAfter:  DefaultRetryAfter,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// DefaultStoreStatus is the storing rule when WithStoreStatus is not given:
// every status below 500 except 408 Request Timeout and 429 Too Many
// Requests. Those two tell the client to try again later, so storing them
// would answer every retry with them for the key's lifetime.
func DefaultStoreStatus(status int) bool {
	return status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
}

// WithMethods sets the methods the middleware covers; requests with any
// other method pass through untouched and Tx returns nil for them. Defaults
// to POST and PATCH: PUT and DELETE are idempotent by definition, and GET
// changes nothing.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		c.methods = make(map[string]bool, len(methods))
		for _, m := range methods {
			c.methods[m] = true
		}
	}
}

// WithRequired makes the Idempotency-Key header mandatory on covered
// methods: a request without it is answered 400 with the problem type
// ProblemMissingKey, and the handler does not run. Defaults to false: a
// request without a key runs in a plain transaction.
func WithRequired(required bool) Option {
	return func(c *config) { c.required = required }
}

// WithScope sets the function that names the key's scope for a request:
// the authenticated principal or tenant. The same key in two scopes is two
// unrelated keys. Defaults to none: every client shares one namespace.
//
// Set it whenever more than one client can reach the handler. Without a
// scope, a key is global: if user B sends a key that user A already used
// for the same request, B receives A's stored response, with whatever it
// discloses. Keys are chosen by clients and may leak or be guessed, so the
// scope, not the key's randomness, is what keeps users apart.
//
// f runs after the key is parsed and before the body is read; it must not
// read the body. An error from
// f is answered 401 with the problem type ProblemUnauthorized, without
// touching the database. f's result is passed to idem.WithScope and must
// satisfy it (at most 255 bytes, no control characters); otherwise the
// request fails with 500. It takes precedence over an idem.WithScope given
// through WithIdemOptions.
func WithScope(f func(*http.Request) (string, error)) Option {
	return func(c *config) { c.scope = f }
}

// WithFingerprint replaces the function that fingerprints a request: two
// requests with the same key and different fingerprints are answered 422
// (ProblemKeyMismatch). body is the whole request body. The result must be
// 1 to 255 bytes without control characters; idem.HashBytes and
// idem.HashJSONBytes produce such values. An error from f is answered 400
// with the problem type ProblemInvalidRequest.
//
// Defaults to the hex SHA-256 of the method, the escaped path, the raw
// query, the headers named by WithFingerprintHeaders and the body.
func WithFingerprint(f func(r *http.Request, body []byte) (string, error)) Option {
	return func(c *config) { c.fingerprint = f }
}

// WithFingerprintHeaders adds the named request headers to the default
// fingerprint, e.g. a tenant or API version header whose change makes it
// another request. It has no effect together with WithFingerprint.
func WithFingerprintHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.fpHeaders = append(c.fpHeaders, http.CanonicalHeaderKey(n))
		}
	}
}

// WithMaxBodyBytes sets the largest request body the middleware buffers for
// a request with a key. A larger body is answered 413 (ProblemBodyTooLarge)
// without touching the database. Requests without a key are not buffered
// and not limited. Defaults to DefaultMaxBodyBytes (1 MiB); n must be
// positive, and a non-positive n keeps the default.
func WithMaxBodyBytes(n int64) Option {
	return func(c *config) {
		if n > 0 {
			c.maxBody = n
		}
	}
}

// WithReplayHeaders adds response headers to those stored and replayed.
// Content-Type, Location and ETag are always stored; other headers reach
// the client on the first response only. Do not list headers that carry
// secrets or per-response values (Set-Cookie, Date).
func WithReplayHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.replayHeader = append(c.replayHeader, http.CanonicalHeaderKey(n))
		}
	}
}

// WithStoreStatus sets which response statuses are stored and replayed.
// A stored status below 400 commits the handler's writes with the key; a
// stored status of 400 or more rolls the writes back and keeps the key
// with the response (a refusal every retry receives again). A status that
// is not stored rolls everything back and frees the key, so a retry runs
// the handler again. Defaults to DefaultStoreStatus.
//
// Put authentication in front of the middleware: a 401 or 403 written by the
// handler is stored like any other 4xx, and a retry after signing in would
// receive it again.
func WithStoreStatus(f func(status int) bool) Option {
	return func(c *config) {
		if f != nil {
			c.storeStatus = f
		}
	}
}

// WithRetryAfter sets the Retry-After sent with 409 (key in progress) and
// 503 (outcome unknown, database unavailable) answers. It is rounded up to
// whole seconds, at least 1. Defaults to DefaultRetryAfter (1s).
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.retryAfter = d
		}
	}
}

// WithIdemOptions passes options to every idem.Do call the middleware
// makes: idem.WithTTL, idem.WithTable, idem.WithWait, idem.WithSealer,
// idem.WithTxOptions. The middleware sets idem.WithReplayed itself, and
// idem.WithScope when WithScope is given.
func WithIdemOptions(opts ...idem.Option) Option {
	return func(c *config) { c.idemOpts = append(c.idemOpts, opts...) }
}
