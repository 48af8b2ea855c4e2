package idemhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
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

// Config is the middleware's settings, checked once by NewMiddleware, and
// an operation handler's (NewOperationHandler lists the fields that apply
// there). The zero value means the defaults each field states. Deployment
// settings of the keys themselves (table, TTL, sealer, observer) belong to
// the idem.Client the middleware is given.
type Config struct {
	// Methods are the methods the middleware covers; requests with other
	// methods pass through untouched and Tx returns nil for them. Methods
	// are case-sensitive, so each must be an upper-case token: "post",
	// which no client sends for POST, is refused. Defaults to POST and
	// PATCH: PUT and DELETE are idempotent by definition, and GET changes
	// nothing.
	Methods []string

	// Required makes the key (the Idempotency-Key header, or what Key
	// reads) mandatory on covered methods: a request without one is
	// answered 400 (ProblemMissingKey) and the handler does not run. Defaults to false: a request without a key
	// runs in a plain transaction.
	Required bool

	// Scope names the key's scope for a request: the authenticated
	// principal or tenant, or for a webhook receiver the sender. The same
	// key in two scopes is two unrelated keys. Required unless SharedKeys
	// is set: NewMiddleware refuses a Config with neither. ContextScope
	// reads the scope that an authentication middleware in front put in
	// the request's context (idem.ContextWithScope).
	//
	// Keys are chosen by clients and may leak or be guessed, so the scope,
	// not the key's randomness, is what keeps one client from receiving
	// another's stored response.
	//
	// Scope runs after the key is read and before the handler; it must not
	// read the body. An error from it, or an empty scope, means the request
	// has no principal: it is answered 401 (ProblemUnauthorized). A scope
	// that idem.ValidateScope refuses (over 255 bytes, say) is bad input,
	// answered 400 (ProblemInvalidRequest). The handler does not run in
	// any of these cases.
	Scope func(*http.Request) (string, error)

	// SharedKeys, set, makes every client share one key space: a keyed
	// request is scoped by the scope in its context if an authentication
	// middleware in front put one there (idem.ContextWithScope), and by the
	// empty scope otherwise. Any client that sends another client's key
	// with the same request then receives that client's stored response.
	// Set it only where a single client (one internal caller, say) can
	// reach the handler. It is an error together with Scope. Defaults to
	// false: a Scope function is required.
	SharedKeys bool

	// Key reads the request's idempotency key from where its sender puts
	// it: a provider's delivery id header (KeyHeader("X-GitHub-Delivery")),
	// or an event id in the body, which the middleware has already read
	// (body is the whole body, within MaxBodyBytes). It returns "" for a
	// request without a key, which then runs as one without an
	// Idempotency-Key (or is answered 400 ProblemMissingKey when Required
	// is set). A key must pass idem.ValidateKey; one that does not, or an
	// error, is answered 400 (ProblemInvalidKey) with the error's text as
	// the detail. Defaults to ParseKey of the Idempotency-Key header.
	Key func(r *http.Request, body []byte) (string, error)

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
	// called NoStore. It must store every status below 400, which
	// NewMiddleware checks: a success that is not stored would reach the
	// client while its writes roll back. Defaults to DefaultStoreStatus.
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
	// 413, 422, 500, 503), and an operation handler's refusals and 404s,
	// in the service's own error format. It is called with Retry-After and
	// Cache-Control already set on w's header and must write p.Status. Defaults to an RFC 9457 application/problem+json body.
	WriteProblem func(w http.ResponseWriter, r *http.Request, p Problem)

	// Logger receives every 5xx answer of the middleware's own (503 outcome
	// unknown or database unavailable, 500 internal errors) with its cause,
	// which the client never sees, and a warning for each handler response
	// the middleware corrected (a status written after the response began,
	// NoStore on a success; see NewMiddleware). Defaults to slog.Default()
	// unless OnError is set.
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
	observer  idem.Observer // what idemOpts and db resolve to, found once
}

// NewMiddleware returns the middleware on db (an *idem.Client, whose Config
// the keys use, or a pool) with cfg. It checks cfg once; an invalid
// setting, a nil db (typed nil included) and a cfg without Scope or
// SharedKeys (nil included) are errors wrapping idem.ErrInvalidOption.
//
// On a covered method with a key (the Idempotency-Key header, or what
// Config.Key reads), the middleware reads the body (up to MaxBodyBytes),
// scopes the key (Config.Scope), fingerprints the request and runs the
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
// The client never receives a 2xx or 3xx for writes that rolled back. Two
// handler mistakes would otherwise send one, and the middleware corrects
// both, logging each at warning level:
//
//   - A status written after the response began (WriteHeader after Write or
//     WriteHeader, as http.Error does after a partial body) is dropped by
//     net/http. Here, a later status of a worse class replaces the response:
//     a 4xx after a 2xx or 3xx, a 5xx after anything below 500. What was
//     written before it is discarded, with the headers that described it
//     (Content-Type, -Encoding, -Language, -Disposition, -Length and
//     -Location, Location, ETag, Last-Modified) unless the handler set
//     them again, and the later status and what follows it are the
//     response, decided as above: a late 5xx rolls back, stores nothing,
//     and reaches the client. A later status of the same or a better class
//     is dropped, as net/http drops it.
//   - NoStore after a 2xx or 3xx: the writes roll back, and the client
//     receives 500 (ProblemInternal) instead of the success.
//
// A retry while the first request runs is answered 409, a retry with
// another request under the same key 422, and a commit whose outcome is
// unknown 503; the Problem* constants list every answer of the middleware's
// own.
//
// On a covered method without a key (and Required unset), the handler runs
// in a plain transaction, also available through Tx, that commits when the
// status is below 400 and rolls back otherwise (with the same two
// corrections). Requests with other methods pass through untouched.
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
	bad := func(format string, args ...any) (*Middleware, error) {
		return nil, fmt.Errorf("%w: idemhttp: %s", idem.ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	if isNil(db) {
		return bad("nil database")
	}
	if cfg == nil {
		return bad("nil Config: set Config.Scope (or Config.SharedKeys)")
	}
	c := *cfg
	switch {
	case c.Scope == nil && !c.SharedKeys:
		return bad("Config.Scope is not set: scope keys by the authenticated principal " +
			"(ContextScope reads the one an authentication middleware put in the context), " +
			"or set Config.SharedKeys if every client may share one key space")
	case c.Scope != nil && c.SharedKeys:
		return bad("SharedKeys has no effect with a Scope function")
	case c.MaxBodyBytes < 0:
		return bad("MaxBodyBytes %d is negative", c.MaxBodyBytes)
	case c.MaxResponseBytes < 0:
		return bad("MaxResponseBytes %d is negative", c.MaxResponseBytes)
	case c.RetryAfter < 0:
		return bad("RetryAfter %v is negative", c.RetryAfter)
	case c.Wait < 0:
		return bad("Wait %v is negative", c.Wait)
	case c.Fingerprint != nil && len(c.FingerprintHeaders) > 0:
		return bad("FingerprintHeaders has no effect with a Fingerprint function")
	}
	return newMiddleware(db, c)
}

func newMiddleware(db idem.Beginner, cfg Config) (*Middleware, error) {
	bad := func(format string, args ...any) (*Middleware, error) {
		return nil, fmt.Errorf("%w: idemhttp: %s", idem.ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	m := &Middleware{db: db, methods: map[string]bool{}, replaySet: map[string]bool{}}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, method := range cfg.Methods {
		if err := checkMethod(method); err != nil {
			return bad("%v", err)
		}
		m.methods[method] = true
	}
	if cfg.StoreStatus != nil {
		// A success that is not stored would reach the client while its
		// writes roll back.
		for status := 200; status < 400; status++ {
			if !cfg.StoreStatus(status) {
				return bad("StoreStatus(%d) is false: every 2xx and 3xx must be stored, "+
					"or a success would reach the client while its writes roll back (use NoStore for one response)", status)
			}
		}
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
	if cfg.Observer != nil {
		m.idemOpts = append(m.idemOpts, idem.WithObserver(cfg.Observer))
	}
	// An option that does not apply to a call, or is out of range, or a
	// database given bare beside its Client, is a configuration error,
	// found now rather than on the first request.
	var err error
	if m.observer, err = idem.ObserverOf(db, m.idemOpts...); err != nil {
		return nil, fmt.Errorf("idemhttp: %w", err)
	}
	m.cfg = cfg
	return m, nil
}

// checkMethod refuses a method that no request can have. HTTP methods are
// case-sensitive (RFC 9110, section 9.1): "post" is not POST, so a Config
// listing it would cover nothing.
func checkMethod(method string) error {
	if method == "" {
		return errors.New("an empty method")
	}
	for i := 0; i < len(method); i++ {
		if !isTokenChar(method[i]) {
			return fmt.Errorf("method %q holds %q, which no method holds", method, method[i])
		}
	}
	if up := strings.ToUpper(method); up != method {
		return fmt.Errorf("method %q is not upper case: methods are case-sensitive, and %q would cover nothing; write %q", method, method, up)
	}
	return nil
}

// isTokenChar reports whether c may appear in an RFC 9110 token.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isNil reports whether db is nil or a nil pointer (a *pgxpool.Pool that
// was never set, say), on which every request would fail or panic.
func isNil(db idem.Beginner) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
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
