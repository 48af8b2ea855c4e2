package payments

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// NewHandler returns the service's HTTP API:
//
//	GET  /healthz        200 when the database answers
//	POST /accounts       201 Account; Idempotency-Key optional
//	GET  /accounts/{id}  200 Account, 404
//	POST /payments       201 Payment; Idempotency-Key required
//
// The write endpoints run behind idemhttp in the request's transaction.
// log receives the errors answered with 5xx; nil discards them.
//
// The example has no authentication, so every client shares one key
// namespace. A real service passes idemhttp.WithScope with the
// authenticated principal, so that one client can never replay another's
// stored answer.
func NewHandler(pool *pgxpool.Pool, log *slog.Logger) http.Handler {
	s := newService(pool, log)
	keyRequired := idemhttp.New(pool, idemhttp.WithRequired(true), idemhttp.WithMaxBodyBytes(MaxBodyBytes))
	keyOptional := idemhttp.New(pool, idemhttp.WithMaxBodyBytes(MaxBodyBytes))
	return s.routes(
		func(e endpoint) http.Handler { return keyOptional(inRequestTx(s, e)) }, // POST /accounts
		func(e endpoint) http.Handler { return keyRequired(inRequestTx(s, e)) }, // POST /payments
	)
}

// NewUnprotectedHandler returns the same API with the same business code,
// each write in a plain transaction of its own and the Idempotency-Key
// ignored: a retried payment is charged again. It exists to show what
// NewHandler prevents; never serve it.
func NewUnprotectedHandler(pool *pgxpool.Pool, log *slog.Logger) http.Handler {
	s := newService(pool, log)
	plain := func(e endpoint) http.Handler { return inPlainTx(s, e) }
	return s.routes(plain, plain)
}

// service holds what the handlers share; there is no package-level state.
type service struct {
	pool *pgxpool.Pool
	log  *slog.Logger
}

func newService(pool *pgxpool.Pool, log *slog.Logger) *service {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &service{pool: pool, log: log}
}

// An endpoint does a request's work in tx and says what to answer. It does
// not write the answer itself: the transaction is settled first.
type endpoint func(r *http.Request, tx pgx.Tx) reply

// routes mounts the API; accountsTx and paymentsTx wrap the write endpoints
// in their transaction handling.
func (s *service) routes(accountsTx, paymentsTx func(endpoint) http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.Handle("POST /accounts", accountsTx(s.handleCreateAccount))
	mux.HandleFunc("GET /accounts/{id}", s.handleGetAccount)
	mux.Handle("POST /payments", paymentsTx(s.handlePayment))
	return mux
}

// inRequestTx runs e in the transaction idemhttp opened for the request.
// idemhttp commits it with a 2xx answer and the key, rolls it back on 4xx
// (keeping the answer for replays) and on 5xx (freeing the key).
func inRequestTx(s *service, e endpoint) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := idemhttp.Tx(r.Context())
		if tx == nil {
			s.internal(r, errors.New("no request transaction: the endpoint is not behind idemhttp")).write(w)
			return
		}
		e(r, tx).write(w)
	})
}

// inPlainTx runs e in a transaction of its own, committed when the answer is
// below 400, and answers only after the commit.
func inPlainTx(s *service, e endpoint) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	})
}

// handleHealthz serves GET /healthz: 200 once the database answers.
func (s *service) handleHealthz(w http.ResponseWriter, r *http.Request) {
	if err := s.pool.Ping(r.Context()); err != nil {
		s.log.WarnContext(r.Context(), "health check: database unreachable", "err", err)
		fail(http.StatusServiceUnavailable, idemhttp.ProblemUnavailable, "the database does not answer").write(w)
		return
	}
	respond(http.StatusOK, map[string]string{"status": "ok"}).write(w)
}

// internal logs err and answers 5xx, which rolls the transaction back and
// leaves the key free: a retry with the same key runs again. Failures that
// may pass (a serialization failure, a lost connection) are answered 503
// with Retry-After, so clients know to retry.
func (s *service) internal(r *http.Request, err error) reply {
	s.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	if idem.Retryable(err) {
		return fail(http.StatusServiceUnavailable, idemhttp.ProblemUnavailable, "a transient failure; retry with the same Idempotency-Key")
	}
	return fail(http.StatusInternalServerError, "about:blank", "internal error")
}
