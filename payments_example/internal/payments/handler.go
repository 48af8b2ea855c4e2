package payments

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/payments_example/api"
)

// Config is NewHandler's settings. The zero value means the defaults each
// field states.
type Config struct {
	// Settler, if not nil, settles each payment in its transaction
	// (settlement.Queue inserts a job there). Defaults to none: payments
	// are not settled.
	Settler Settler

	// Charges, if not nil, serves POST /charges: charges at the processor
	// while the client waits (NewCharges). It must be made with the
	// handler's keys. Defaults to none: POST /charges answers 501.
	Charges *Charges

	// Logger receives the errors answered with 5xx. Defaults to
	// discarding them.
	Logger *slog.Logger

	// PaymentRate is how many POST /payments and POST /charges one
	// account may send per second, together, sustained; PaymentBurst how
	// many at once after a pause.
	// Beyond them the answer is 429 (ProblemTooManyRequests) with
	// Retry-After, before the Idempotency-Key is looked at: nothing runs
	// and nothing is stored. Every stored key costs the key table about a
	// kilobyte or two for its TTL, so the rate bounds what one account
	// can make the service keep (docs/SECURITY.md has the figure). They
	// default to DefaultPaymentRate and DefaultPaymentBurst; rate.Inf
	// removes the limit (the tests' setting). Neither may be negative.
	PaymentRate  rate.Limit
	PaymentBurst int
}

// NewHandler returns the service's HTTP API, as ../../openapi.yaml
// describes it and package api routes it:
//
//	GET  /healthz        open; 200 when the database answers
//	GET  /openapi.yaml   open; the API's OpenAPI document
//	POST /accounts       open (sign-up); 201 with the account's API key
//	GET  /accounts/{id}  API key; 200 Account, 404 for another account's
//	POST /payments       API key and Idempotency-Key; 201 Payment; rate-limited per account
//	GET  /payments/{id}  API key; 200 PaymentStatus, 404 for another account's
//	POST /charges        API key and Idempotency-Key; 201 Charge; rate-limited with POST /payments
//
// POST /payments runs behind idemhttp, configured on keys (an idem.Client
// on pool), with the API key's account as the idempotency scope: every
// keyed request has an authenticated account, and one without is refused
// 401 before any key is looked at, never run in a scope shared by all.
// POST /charges is cfg.Charges's operation, served by idemhttp's handler
// for operations under the same rules.
// The service's metrics are not part of this API: serve them on a
// listener of their own (see the command's -metrics-addr).
func NewHandler(pool *pgxpool.Pool, keys *idem.Client, cfg *Config) (http.Handler, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	limits, err := newPerAccount(cfg.PaymentRate, cfg.PaymentBurst)
	if err != nil {
		return nil, err
	}
	s := newServer(pool, cfg.Settler, cfg.Logger)
	mw, err := newKeyMiddleware(keys, s.log)
	if err != nil {
		return nil, err
	}
	if cfg.Charges != nil {
		if s.charges, err = newChargeHandler(cfg.Charges, s.log); err != nil {
			return nil, err
		}
	}
	s.payWrite = s.inRequestTx
	limited := func(h http.Handler) http.Handler { return s.limit(limits, h) }
	return s.routes(func(h http.Handler) http.Handler { return limited(mw.Handler(h)) }, limited), nil
}

// newKeyMiddleware returns the idemhttp middleware of POST /payments. Its
// Scope is the account that requireAccount, in front, put in the
// context, set explicitly rather than left to idemhttp's default: a
// request that reaches it without an account (a route wired without
// requireAccount) is answered 401 and runs nothing, instead of running
// under one namespace that every client shares.
func newKeyMiddleware(keys *idem.Client, log *slog.Logger) (*idemhttp.Middleware, error) {
	return idemhttp.NewMiddleware(keys, keyConfig(log))
}

// newChargeHandler returns the handler of POST /charges: idemhttp's for
// c's operation, with the middleware's key rules, answering 201.
func newChargeHandler(c *Charges, log *slog.Logger) (http.Handler, error) {
	return idemhttp.NewOperationHandler(c.op, keyConfig(log), &idemhttp.OperationOptions[chargeRequest, api.Charge]{
		Decode: decodeCharge,
		Status: func(api.Charge) int { return http.StatusCreated },
	})
}

// keyConfig is the idemhttp configuration of the keyed operations.
func keyConfig(log *slog.Logger) *idemhttp.Config {
	return &idemhttp.Config{
		Required:     true,
		MaxBodyBytes: MaxBodyBytes,
		Logger:       log,
		Scope: func(r *http.Request) (string, error) {
			account, ok := accountFrom(r.Context())
			if !ok {
				return "", errNoCredentials
			}
			return scopeOf(account), nil
		},
		Challenge: bearerChallenge,
	}
}

// NewUnprotectedHandler returns the same API with the same business code
// and the same authentication, each payment in a plain transaction of its
// own and the Idempotency-Key ignored: a retried payment is charged again.
// It exists to show what NewHandler prevents; never serve it. settler,
// if not nil, settles each payment in its transaction (the demo gives it
// settlement.Direct). It has no rate limit.
func NewUnprotectedHandler(pool *pgxpool.Pool, settler Settler, log *slog.Logger) http.Handler {
	s := newServer(pool, settler, log)
	s.payWrite = s.inPlainTx
	none := func(h http.Handler) http.Handler { return h }
	return s.routes(none, none)
}

// server implements api.ServerInterface; there is no package-level state.
type server struct {
	pool    *pgxpool.Pool
	settler Settler      // nil: payments are not settled
	charges http.Handler // POST /charges; nil: answered 501
	log     *slog.Logger
	// payWrite runs POST /payments's endpoint in a transaction and writes
	// its answer once the transaction is settled.
	payWrite func(w http.ResponseWriter, r *http.Request, e endpoint)
}

var _ api.ServerInterface = (*server)(nil)

func newServer(pool *pgxpool.Pool, settler Settler, log *slog.Logger) *server {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &server{pool: pool, settler: settler, log: log}
}

// An endpoint does a request's work in tx and says what to answer. It does
// not write the answer itself: the transaction is settled first.
type endpoint func(r *http.Request, tx pgx.Tx) reply

// routes puts authentication and idempotency in front of the generated
// router. Every operation requires an API key unless it is listed as open
// here, so an operation added to the spec is closed until it is opened on
// purpose; a test checks this list against the spec's security.
// idempotent wraps the operations that run behind the idemhttp
// middleware, limited the operations that handle their key themselves.
func (s *server) routes(idempotent, limited func(http.Handler) http.Handler) http.Handler {
	generated := api.HandlerWithOptions(s, api.StdHTTPServerOptions{ErrorHandlerFunc: s.badParameter})
	mux := http.NewServeMux()
	mux.Handle("/", s.requireAccount(generated))
	mux.Handle("GET /healthz", generated)
	mux.Handle("GET /openapi.yaml", generated)
	// The metrics are served on the command's internal listener only. A
	// plain 404 here, not the 401 of an unknown path, so that a scraper
	// pointed at the public address is told there is nothing to find.
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		fail(http.StatusNotFound, "about:blank", "not found").write(w)
	})
	mux.Handle("POST /accounts", generated)
	mux.Handle("POST /payments", s.requireAccount(idempotent(generated)))
	mux.Handle("POST /charges", s.requireAccount(limited(generated)))
	return mux
}

// badParameter answers a request whose parameters the generated router
// cannot parse. The error is not echoed: it holds the client's bytes.
func (s *server) badParameter(w http.ResponseWriter, r *http.Request, err error) {
	var (
		format  *api.InvalidParamFormatError
		missing *api.RequiredHeaderError
	)
	switch {
	case errors.As(err, &format) && format.ParamName == "id" && strings.HasPrefix(r.URL.Path, "/payments/"):
		// Not a UUID is not a payment: the same 404 as any other.
		fail(http.StatusNotFound, ProblemNoSuchPayment, "no such payment").write(w)
	case errors.As(err, &format) && format.ParamName == "id":
		// Not a UUID is not an account: the same 404 as any other.
		fail(http.StatusNotFound, ProblemNoSuchAccount, "no such account").write(w)
	case errors.As(err, &missing) && missing.ParamName == idemhttp.HeaderKey:
		fail(http.StatusBadRequest, idemhttp.ProblemMissingKey, "this request needs an "+idemhttp.HeaderKey+" header").write(w)
	default:
		fail(http.StatusBadRequest, ProblemInvalidRequest, "a parameter of the request is not valid").write(w)
	}
}

// inRequestTx runs e in the transaction idemhttp opened for the request.
// idemhttp commits it with a 2xx answer and the key, rolls it back and
// keeps the answer on a stored refusal (402), and rolls it back and frees
// the key otherwise (400, 5xx, and the 404 that pay marks NoStore).
func (s *server) inRequestTx(w http.ResponseWriter, r *http.Request, e endpoint) {
	tx := idemhttp.Tx(r.Context())
	if tx == nil {
		// A wiring mistake: never charge outside idemhttp.
		s.internal(r, errors.New("no request transaction: the endpoint is not behind idemhttp")).write(w)
		return
	}
	e(r, tx).write(w)
}

// inPlainTx runs e in a transaction of its own, committed when the answer
// is below 400, and answers only after the commit.
func (s *server) inPlainTx(w http.ResponseWriter, r *http.Request, e endpoint) {
	ctx := r.Context()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		s.internal(r, err).write(w)
		return
	}
	// The rollback must reach the server even if the client went away.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rep := e(r, tx)
	if rep.status < 400 {
		if err := tx.Commit(ctx); err != nil {
			rep = s.internal(r, err)
		}
	}
	rep.write(w)
}

// GetHealth serves GET /healthz: 200 once the database answers.
func (s *server) GetHealth(w http.ResponseWriter, r *http.Request) {
	if err := s.pool.Ping(r.Context()); err != nil {
		s.log.WarnContext(r.Context(), "health check: database unreachable", "err", err)
		fail(http.StatusServiceUnavailable, idemhttp.ProblemUnavailable, "the database does not answer").write(w)
		return
	}
	respond(http.StatusOK, api.Health{Status: api.Ok}).write(w)
}

// GetOpenAPI serves GET /openapi.yaml: the spec with every reference
// resolved.
func (s *server) GetOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(api.Spec())
}

// internal logs err and answers 5xx, which rolls the transaction back and
// leaves the key free: a retry with the same key runs again. Failures that
// may pass (a serialization failure, a lost connection) are answered 503
// with Retry-After, so clients know to retry.
func (s *server) internal(r *http.Request, err error) reply {
	s.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	if idem.Retryable(err) {
		return fail(http.StatusServiceUnavailable, idemhttp.ProblemUnavailable, "a transient failure; retry with the same Idempotency-Key")
	}
	return fail(http.StatusInternalServerError, "about:blank", "internal error")
}
