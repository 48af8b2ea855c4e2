package idemhttp

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// DefaultMaxBodyBytes is the largest request body the middleware buffers
// when Config.MaxBodyBytes is not set: 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// DefaultMaxResponseBytes is the largest response body the middleware holds
// and stores when Config.MaxResponseBytes is not set: 1 MiB.
const DefaultMaxResponseBytes = 1 << 20

// DefaultRetryAfter is the Retry-After sent with 409 and 503 answers when
// Config.RetryAfter is not set.
const DefaultRetryAfter = time.Second

// DefaultProblemBase is the prefix of the problem types of the middleware's
// own answers when Config.ProblemBase is not set: the types are relative
// references such as "/problems/in-progress", resolved against the
// service's own URL.
const DefaultProblemBase = "/problems/"

// defaultReplayHeaders are the response headers stored and replayed with
// every response: those that describe the representation (its type,
// encoding, language and disposition) or name the resource (Location,
// Content-Location) and its version (ETag, Last-Modified). A replay without
// them would be another representation; a gzip body replayed without
// Content-Encoding could not even be decoded.
var defaultReplayHeaders = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Disposition",
	"Content-Location", "Location", "Etag", "Last-Modified",
}

// Config is the middleware's settings, checked once by NewMiddleware. The
// zero value means the defaults each field states. Deployment settings of
// the keys themselves (table, TTL, sealer, observer) belong to the
// idem.Client the middleware is given.
type Config struct {
	// Methods are the methods the middleware covers; requests with other
	// methods pass through untouched and Tx returns nil for them. Defaults
	// to POST and PATCH: PUT and DELETE are idempotent by definition, and GET
	// changes nothing.
	Methods []string

	// Required makes the Idempotency-Key header mandatory on covered
	// methods: a request without it is answered 400 (ProblemMissingKey) and
	// the handler does not run. Defaults to false: a request without a key
	// runs in a plain transaction.
	Required bool

	// Scope names the key's scope for a request: the authenticated
	// principal or tenant. The same key in two scopes is two unrelated
	// keys. Defaults to the scope in the request's context
	// (idem.ContextWithScope), which an authentication middleware in front
	// sets; without either, every client shares one namespace.
	//
	// Set one whenever more than one client can reach the handler. Without
	// a scope, a key is global: if user B sends a key that user A already
	// used for the same request, B receives A's stored response. Keys are
	// chosen by clients and may leak or be guessed, so the scope, not the
	// key's randomness, is what keeps users apart.
	//
	// Scope runs after the key is parsed and before the body is read; it
	// must not read the body. An error from it is answered 401
	// (ProblemUnauthorized); a scope that idem.ValidateScope refuses (over
	// 255 bytes, say) is bad input, answered 400 (ProblemInvalidRequest).
	// The handler does not run in either case.
	Scope func(*http.Request) (string, error)

	// Challenge is the WWW-Authenticate challenge sent with the 401 answered
	// when Scope fails, as RFC 9110 requires of every 401: the scheme (and
	// parameters) the service authenticates with. Defaults to "Bearer".
	Challenge string

	// Fingerprint replaces the function that fingerprints a request: two
	// requests with the same key and different fingerprints are answered
	// 422 (ProblemKeyMismatch). body is the whole request body. The result
	// must be 1 to 255 bytes without control characters; idem.HashBytes and
	// idem.HashJSONBytes produce such values. An error is answered 400
	// (ProblemInvalidRequest). Defaults to DefaultFingerprint with
	// FingerprintHeaders.
	Fingerprint func(r *http.Request, body []byte) (string, error)

	// FingerprintHeaders adds the named request headers to the default
	// fingerprint, e.g. an API version header whose change makes it another
	// request. It is an error together with Fingerprint.
	FingerprintHeaders []string

	// MaxBodyBytes is the largest request body the middleware buffers, with
	// or without a key. A larger body is answered 413 (ProblemBodyTooLarge)
	// without touching the database. Defaults to DefaultMaxBodyBytes
	// (1 MiB); must not be negative.
	MaxBodyBytes int64

	// MaxResponseBytes is the largest response body the middleware holds
	// until the transaction ends and stores under the key. A handler that
	// writes more is answered 500 (ProblemResponseTooLarge): its writes roll
	// back and nothing is stored. Defaults to DefaultMaxResponseBytes
	// (1 MiB); must not be negative.
	MaxResponseBytes int64

	// ReplayHeaders adds response headers to those stored and replayed.
	// Content-Type, Content-Encoding, Content-Language, Content-Disposition,
	// Content-Location, Location, ETag and Last-Modified always are; other
	// headers reach the client on the first response only. Do not list
	// headers that carry secrets or per-response values (Set-Cookie, Date).
	ReplayHeaders []string

	// StoreStatus decides which response statuses are stored and replayed.
	// A stored status below 400 commits the handler's writes with the key; a
	// stored status of 400 or more rolls the writes back and keeps the key
	// with the response (a refusal every retry receives again). A status
	// that is not stored rolls everything back and frees the key, so a retry
	// runs the handler again; so does any response for which the handler
	// called NoStore. Defaults to DefaultStoreStatus.
	StoreStatus func(status int) bool

	// RetryAfter is sent with 409 (key in progress) and 503 (outcome
	// unknown, database unavailable) answers, rounded up to whole seconds,
	// at least 1. Defaults to DefaultRetryAfter (1s); must not be negative.
	RetryAfter time.Duration

	// Wait makes a request whose key is in progress wait up to Wait for the
	// first request to finish and then receive its answer, instead of 409
	// at once (idem.WithWait). Defaults to 0.
	Wait time.Duration

	// TxOptions sets the isolation and deferrable modes of the request's
	// transaction, with or without a key (idem.WithTxOptions). Defaults to
	// the server's default.
	TxOptions pgx.TxOptions

	// Observer, if set, is told about every covered request with a key, and
	// about requests the middleware refuses before any call, with the HTTP
	// status answered (idem.CallEnd.HTTPStatus; 0 when the handler panicked
	// and no answer was written). It replaces the idem Client's
	// Config.Observer for these calls. Defaults to the Client's.
	Observer idem.Observer

	// ProblemBase replaces "/problems/" in the types of the middleware's own
	// problem answers: with "https://errors.example.com/idem/", the type of
	// ProblemInProgress is "https://errors.example.com/idem/in-progress". It
	// is a prefix, so it ends with the separator it needs ("/" or "#").
	// Defaults to DefaultProblemBase.
	ProblemBase string

	// WriteProblem renders the middleware's own answers (400, 401, 409,
	// 413, 422, 500, 503) in the service's own error format. It is called
	// with Retry-After and Cache-Control already set on w's header and must
	// write p.Status. Defaults to an RFC 9457 application/problem+json body.
	WriteProblem func(w http.ResponseWriter, r *http.Request, p Problem)

	// Logger receives every 5xx answer of the middleware's own (503 outcome
	// unknown or database unavailable, 500 internal errors) with its cause,
	// which the client never sees. Defaults to slog.Default() unless OnError
	// is set.
	Logger *slog.Logger

	// OnError, if set, is called with every 5xx answer of the middleware's
	// own and its cause, after the answer is written: for error trackers.
	OnError func(r *http.Request, p Problem, err error)
}

// Middleware is the configured middleware: Handler wraps a handler in it.
type Middleware struct {
	cfg       Config
	db        idem.Beginner
	methods   map[string]bool
	replay    []string
	replaySet map[string]bool
	log       *slog.Logger
	idemOpts  []idem.Option
	// legacy: built by the deprecated New, whose options may carry an
	// idem.WithScope that the Scope function has always overridden.
	legacy   bool
	observer idem.Observer // what idemOpts and db resolve to, found once
}

// NewMiddleware returns the middleware on db (an *idem.Client, whose Config
// the keys use, or a pool) with cfg (nil means the defaults). It checks cfg
// once; an invalid setting is an error wrapping idem.ErrInvalidOption.
//
// On a covered method with an Idempotency-Key header, the middleware reads
// the body (up to MaxBodyBytes), fingerprints the request and runs the
// handler inside idem.Run: the handler finds the transaction with
// Tx(r.Context()) and the key with idem.KeyFromContext, and does its
// database writes through the transaction. The response is held until the
// transaction ends, then decided by its status (see Config.StoreStatus and
// DefaultStoreStatus):
//
//   - stored, below 400: the writes commit together with the key and the
//     response; a retry with the same key replays the response with
//     Idempotent-Replayed: true, without running the handler.
//   - stored, 400 or above: the writes roll back, and the key commits with
//     the response, which every retry receives again.
//   - not stored (400, 5xx and others by default, or after NoStore):
//     everything rolls back and the key stays free, so a retry runs the
//     handler again. The client receives the handler's response.
//
// A retry while the first request runs is answered 409, a retry with
// another request under the same key 422, and a commit whose outcome is
// unknown 503; the Problem* constants list every answer of the middleware's
// own.
//
// On a covered method without a key (and Required unset), the handler runs
// in a plain transaction, also available through Tx, that commits when the
// status is below 400 and rolls back otherwise. Requests with other methods
// pass through untouched.
//
// On every path the transaction ends, and its connection returns to the
// pool, before the first byte of the response is written: a client that
// never reads its socket cannot hold a database connection.
//
// The handler must not keep the transaction after it returns, nor commit or
// roll it back (both return idem.ErrTxOwned). It should pass r.Context() to
// its queries: it ends when the client leaves. Once the handler has
// returned, the client's departure no longer matters; the outcome is
// decided by the status the handler wrote.
//
// A panic in the handler rolls the transaction back, leaves no key, and
// propagates: net/http's server (or an outer recovery middleware) handles
// it, and the client receives no response, as without the middleware.
//
// Responses are held in memory until the transaction ends (up to
// MaxResponseBytes): the middleware suits API responses, not downloads or
// streams (the writer supports neither flushing nor hijacking).
// Informational (1xx) responses are dropped.
func NewMiddleware(db idem.Beginner, cfg *Config) (*Middleware, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: idemhttp.NewMiddleware: nil database", idem.ErrInvalidOption)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	return newMiddleware(db, *cfg, nil)
}

func newMiddleware(db idem.Beginner, cfg Config, legacy []idem.Option) (*Middleware, error) {
	bad := func(format string, args ...any) (*Middleware, error) {
		return nil, fmt.Errorf("%w: idemhttp: %s", idem.ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.MaxBodyBytes < 0:
		return bad("MaxBodyBytes %d is negative", cfg.MaxBodyBytes)
	case cfg.MaxResponseBytes < 0:
		return bad("MaxResponseBytes %d is negative", cfg.MaxResponseBytes)
	case cfg.RetryAfter < 0:
		return bad("RetryAfter %v is negative", cfg.RetryAfter)
	case cfg.Wait < 0:
		return bad("Wait %v is negative", cfg.Wait)
	case cfg.Fingerprint != nil && len(cfg.FingerprintHeaders) > 0:
		return bad("FingerprintHeaders has no effect with a Fingerprint function")
	}
	m := &Middleware{db: db, methods: map[string]bool{}, replaySet: map[string]bool{}}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, method := range cfg.Methods {
		if method == "" || strings.ContainsAny(method, " \t\r\n") {
			return bad("invalid method %q", method)
		}
		m.methods[method] = true
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	if cfg.StoreStatus == nil {
		cfg.StoreStatus = DefaultStoreStatus
	}
	if cfg.Challenge == "" {
		cfg.Challenge = "Bearer"
	}
	if cfg.ProblemBase == "" {
		cfg.ProblemBase = DefaultProblemBase
	}
	if cfg.Fingerprint == nil {
		headers := make([]string, len(cfg.FingerprintHeaders))
		for i, h := range cfg.FingerprintHeaders {
			headers[i] = http.CanonicalHeaderKey(h)
		}
		cfg.Fingerprint = fingerprintWith(headers)
	}
	for _, name := range append(slices.Clone(defaultReplayHeaders), cfg.ReplayHeaders...) {
		name = http.CanonicalHeaderKey(name)
		if !m.replaySet[name] {
			m.replaySet[name] = true
			m.replay = append(m.replay, name)
		}
	}
	m.log = cfg.Logger
	if m.log == nil && cfg.OnError == nil {
		m.log = slog.Default()
	}
	if cfg.Wait > 0 {
		m.idemOpts = append(m.idemOpts, idem.WithWait(cfg.Wait))
	}
	if cfg.TxOptions != (pgx.TxOptions{}) {
		m.idemOpts = append(m.idemOpts, idem.WithTxOptions(cfg.TxOptions))
	}
	m.idemOpts = append(m.idemOpts, legacy...)
	m.legacy = len(legacy) > 0
	if cfg.Observer != nil {
		m.idemOpts = append(m.idemOpts, idem.WithObserver(cfg.Observer))
	}
	// An option that does not apply to a call, or is out of range, is a
	// configuration error, found now rather than on the first request.
	if err := idem.CheckOptions(m.idemOpts...); err != nil {
		return nil, fmt.Errorf("idemhttp: %w", err)
	}
	m.observer = idem.ObserverOf(db, m.idemOpts...)
	m.cfg = cfg
	return m, nil
}

// Handler returns next wrapped in the middleware.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return &handler{m: m, next: next}
}

// DefaultStoreStatus is the storing rule when Config.StoreStatus is not
// set. Stored and replayed: 2xx and 3xx, and the 4xx that report the
// outcome of an operation that ran (402 Payment Required, 404 Not Found,
// 409 Conflict, 410 Gone, 412 Precondition Failed, 451, and any 4xx not
// listed below). Not stored, so the key stays free and a retry runs the
// handler: every 5xx; and the 4xx that reject the request before the
// operation starts or tell the client to come back, so that a corrected or
// later retry with the same key is not answered with the old refusal:
//
//	400 Bad Request (validation: fix the body and retry with the same key)
//	401, 403, 407 (credentials and permissions can change)
//	405, 406, 411, 413, 414, 415, 416, 417, 421, 422, 426, 428, 431
//	    (the request's form: method, media type, size, preconditions)
//	408, 423, 424, 425, 429 (come back later)
//
// This is the rule Stripe applies: a request that fails validation, or
// conflicts with one in flight, saves no result.
func DefaultStoreStatus(status int) bool {
	switch {
	case status < 400:
		return true
	case status >= 500:
		return false
	}
	switch status {
	case 400, 401, 403, 405, 406, 407, 408, 411, 413, 414, 415, 416, 417,
		421, 422, 423, 424, 425, 426, 428, 429, 431:
		return false
	}
	return true
}
