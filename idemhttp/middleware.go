package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// New returns the middleware. db is usually a *pgxpool.Pool.
//
// On a covered method (WithMethods; POST and PATCH by default) with an
// Idempotency-Key header, the middleware reads the body (up to
// WithMaxBodyBytes), fingerprints the request and runs the handler inside
// idem.Do: the handler finds the transaction with Tx(r.Context()) and does
// its database writes through it. The handler's response is held until the
// transaction ends, then decided by its status (see WithStoreStatus):
//
//   - stored, below 400: the writes commit together with the key and the
//     response; a retry with the same key replays the response with
//     Idempotent-Replayed: true, without running the handler.
//   - stored, 400 or above: the writes roll back, and the key commits with
//     the response, which every retry receives again.
//   - not stored (5xx by default): everything rolls back and the key stays
//     free, so a retry runs the handler again. The client receives the
//     handler's response.
//
// A retry while the first request runs is answered 409, a retry with
// another request under the same key 422, and a commit whose outcome is
// unknown 503; the Problem* constants list every answer of the middleware's
// own, each as application/problem+json.
//
// On a covered method without a key (and WithRequired unset), the handler
// runs in a plain transaction, also available through Tx, that commits when
// the status is below 400 and rolls back otherwise. Requests with other
// methods pass through untouched.
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
// Responses are held in memory until the transaction ends, and stored
// responses in the database: the middleware suits API responses, not
// downloads or streams (the writer supports neither flushing nor
// hijacking). Informational (1xx) responses are dropped.
//
// New panics if db is nil or an option passed through WithIdemOptions is
// invalid (see idem.ErrInvalidOption, idem.ErrInvalidTable).
func New(db idem.Beginner, opts ...Option) func(http.Handler) http.Handler {
	if db == nil {
		panic("idemhttp.New: nil database")
	}
	cfg := newConfig(opts)
	if err := idem.CheckOptions(cfg.idemOpts...); err != nil {
		panic("idemhttp.New: " + err.Error())
	}
	if cfg.fingerprint == nil {
		cfg.fingerprint = defaultFingerprint(cfg.fpHeaders)
	}
	replay := []string{"Content-Type", "Location", "Etag"}
	for _, name := range cfg.replayHeader {
		if !slices.Contains(replay, name) {
			replay = append(replay, name)
		}
	}
	cfg.replayHeader = replay
	return func(next http.Handler) http.Handler {
		return &middleware{cfg: cfg, db: db, next: next}
	}
}

type txKey struct{}

// Tx returns the request's transaction for handlers running under the
// middleware on a covered method, nil otherwise.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

type middleware struct {
	cfg  config
	db   idem.Beginner
	next http.Handler
}

// errNotStored makes idem.Do roll back a response that is not to be stored.
var errNotStored = errors.New("idemhttp: response status not stored")

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !m.cfg.methods[r.Method] {
		m.next.ServeHTTP(w, r)
		return
	}
	key, err := ParseKey(r.Header)
	if err != nil {
		m.problem(w, ProblemInvalidKey, err.Error())
		return
	}
	if key == "" {
		if m.cfg.required {
			m.problem(w, ProblemMissingKey, "this request needs an "+HeaderKey+" header")
			return
		}
		if _, ok := m.readBody(w, r); ok {
			m.serveUnkeyed(w, r)
		}
		return
	}

	var scopeOpt idem.Option
	if m.cfg.scope != nil {
		scope, err := m.cfg.scope(r)
		if err != nil {
			m.problem(w, ProblemUnauthorized, "the request has no principal to scope its key by")
			return
		}
		scopeOpt = idem.WithScope(scope)
	}

	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	fingerprint, err := m.cfg.fingerprint(r, body)
	if err != nil {
		m.problem(w, ProblemInvalidRequest, "the request could not be fingerprinted: "+err.Error())
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))

	// Do runs on a context that the client's departure cancels only until
	// the handler starts: from then on, the handler's status decides.
	ctx := r.Context()
	doCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()

	var (
		replayed bool
		captured *capture
	)
	opts := append(slices.Clip(m.cfg.idemOpts), idem.WithReplayed(&replayed), scopeOpt)
	stored, err := idem.Do(doCtx, m.db, key, fingerprint, func(tx pgx.Tx) (response, error) {
		if !stop() {
			return response{}, fmt.Errorf("idemhttp: client left: %w", context.Cause(ctx))
		}
		captured = newCapture()
		m.next.ServeHTTP(captured, r.WithContext(context.WithValue(ctx, txKey{}, tx)))
		captured.finish()
		status := captured.status
		resp := captured.stored(m.cfg.replayHeader)
		switch {
		case !m.cfg.storeStatus(status):
			return resp, errNotStored
		case status >= 400:
			return resp, idem.Refuse("http_"+strconv.Itoa(status), http.StatusText(status)).WithStatus(status)
		}
		return resp, nil
	}, opts...)

	_, refused := errors.AsType[*idem.Refusal](err)
	switch {
	case err == nil || refused || errors.Is(err, errNotStored):
		if replayed || captured == nil {
			stored.writeTo(w, replayed)
		} else {
			captured.full().writeTo(w, false)
		}
	case errors.Is(err, idem.ErrMismatch):
		m.problem(w, ProblemKeyMismatch, "this key was used with a different request; use a new key for a new request")
	case errors.Is(err, idem.ErrInProgress):
		m.problem(w, ProblemInProgress, "a request with this key is being processed; retry later with the same key")
	case errors.Is(err, idem.ErrOutcomeUnknown):
		m.problem(w, ProblemOutcomeUnknown, "the outcome of this request is unknown; retry with the same key to learn it")
	case idem.Retryable(err) || ctx.Err() != nil:
		m.problem(w, ProblemUnavailable, "the request could not be processed and left no trace; retry with the same key")
	default:
		m.problem(w, ProblemInternal, "the request could not be processed")
	}
}

// readBody reads the whole body within the limit, before any database work,
// and puts it back for the handler. It answers the request itself (413, or
// 400 for an unreadable body) and reports false when it cannot.
func (m *middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Body == nil {
		r.Body = http.NoBody
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			m.problem(w, ProblemBodyTooLarge, fmt.Sprintf("the body exceeds %d bytes", m.cfg.maxBody))
		} else {
			m.problem(w, ProblemInvalidRequest, "the body could not be read")
		}
		return nil, false
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, true
}

// serveUnkeyed runs the handler in a plain transaction.
func (m *middleware) serveUnkeyed(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, err := m.db.Begin(ctx)
	if err != nil {
		m.problem(w, ProblemUnavailable, "the database is unavailable")
		return
	}
	defer func() {
		// The rollback must run even when ctx has ended, which may be why;
		// after Commit it is a no-op returning pgx.ErrTxClosed.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()

	c := newCapture()
	m.next.ServeHTTP(c, r.WithContext(context.WithValue(ctx, txKey{}, pgx.Tx(ownedTx{tx}))))
	c.finish()
	if c.status < 400 {
		if err := tx.Commit(context.WithoutCancel(ctx)); err != nil {
			m.problem(w, ProblemUnavailable, "the transaction did not commit")
			return
		}
	}
	c.full().writeTo(w, false)
}

// rollbackTimeout bounds the rollback of a plain transaction.
const rollbackTimeout = 5 * time.Second

func (m *middleware) problem(w http.ResponseWriter, typ, detail string) {
	writeProblem(w, typ, detail, m.cfg.retryAfter)
}

// ownedTx is the plain transaction handed to a handler: ending it belongs to
// the middleware, as with idem.Do.
type ownedTx struct{ pgx.Tx }

// Commit returns idem.ErrTxOwned: the middleware commits.
func (ownedTx) Commit(context.Context) error { return idem.ErrTxOwned }

// Rollback returns idem.ErrTxOwned: write a status of 400 or more to roll
// back.
func (ownedTx) Rollback(context.Context) error { return idem.ErrTxOwned }
