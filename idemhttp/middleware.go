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

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

type txKey struct{}

// Tx returns the request's transaction for handlers running under the
// middleware on a covered method, nil otherwise.
func Tx(ctx context.Context) pgx.Tx {
	st, _ := ctx.Value(txKey{}).(*requestState)
	if st == nil {
		return nil
	}
	return st.tx
}

// NoStore marks the response to the request whose context is ctx as not to
// be stored, whatever its status: the transaction rolls back, the key stays
// free, and a retry with the same key runs the handler again. Use it for an
// answer that must not outlive this attempt (a refusal written with a
// status that DefaultStoreStatus would store, say). A success (2xx or 3xx)
// marked so is not sent: its writes rolled back, so the client receives 500
// (ProblemInternal) and the logger a warning. It reports whether ctx
// belongs to a request under the middleware.
func NoStore(ctx context.Context) bool {
	st, _ := ctx.Value(txKey{}).(*requestState)
	if st == nil {
		return false
	}
	st.noStore = true
	return true
}

// requestState is what the middleware shares with the handler through the
// request's context.
type requestState struct {
	tx      pgx.Tx
	noStore bool
}

type handler struct {
	m    *Middleware
	next http.Handler
}

// errNotStored makes idem.Run roll back a response that is not to be stored.
var errNotStored = errors.New("idemhttp: response not stored")

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if !m.methods[r.Method] {
		h.next.ServeHTTP(w, r)
		return
	}
	key, body, ok := h.readKey(w, r)
	if !ok {
		return
	}
	if key == "" {
		if m.cfg.Required {
			h.refuseMissingKey(w, r)
			return
		}
		if m.cfg.Key != nil || h.readBodyInto(w, r, &body) {
			h.serveUnkeyed(w, r)
		}
		return
	}

	ctx, ok := h.scope(w, r)
	if !ok {
		return
	}
	if m.cfg.Key == nil && !h.readBodyInto(w, r, &body) {
		return
	}
	fingerprint, err := m.cfg.Fingerprint(r, body)
	if err != nil {
		h.refuse(w, r, ProblemInvalidRequest, "the request could not be fingerprinted")
		return
	}

	// The call runs on a context that the client's departure cancels only
	// until the handler starts: from then on, the handler's status decides.
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()

	obs := newObservation(m, h.observer())
	// A panicking handler writes no answer; its call is still reported.
	defer obs.done(0)
	opts := m.idemOpts
	if obs != nil {
		opts = append(slices.Clip(opts), idem.WithObserver(obs))
	}
	var (
		captured *capture
		st       *requestState
	)
	stored, outcome, err := idem.Run(callCtx, m.db, key, fingerprint, func(workCtx context.Context, tx pgx.Tx) (response, error) {
		if !stop() {
			return response{}, fmt.Errorf("idemhttp: client left: %w", context.Cause(ctx))
		}
		captured = newCapture(m.cfg.MaxResponseBytes)
		st = &requestState{tx: tx}
		// The handler sees the request's own context (its values, its
		// cancellation) with the call's key and the observer's span.
		hctx := mergeValues(ctx, workCtx)
		h.next.ServeHTTP(captured, r.WithContext(context.WithValue(hctx, txKey{}, st)))
		captured.finish()
		if captured.overflow {
			return response{}, errResponseTooLarge
		}
		status := captured.status
		resp := captured.stored(m.replay)
		switch {
		case st.noStore || !m.cfg.StoreStatus(status):
			return resp, errNotStored
		case status >= 400:
			return resp, idem.Refuse("http_"+strconv.Itoa(status), http.StatusText(status)).WithStatus(status)
		}
		return resp, nil
	}, opts...)

	if captured != nil {
		h.warnReplaced(r, captured)
	}
	if errors.Is(err, errNotStored) && st != nil && st.noStore && captured.status < 400 {
		status := h.noStoredSuccess(w, r, captured.status)
		obs.done(status)
		return
	}
	status := h.answer(w, r, ctx, captured, stored, outcome, err)
	obs.done(status)
}

// readKey returns the request's key ("" for none) and, when Config.Key
// reads it, the body. It answers the request itself and reports false when
// the key is malformed or the body cannot be read.
func (h *handler) readKey(w http.ResponseWriter, r *http.Request) (key string, body []byte, ok bool) {
	if h.m.cfg.Key == nil {
		key, err := ParseKey(r.Header)
		if err != nil {
			h.refuse(w, r, ProblemInvalidKey, err.Error())
			return "", nil, false
		}
		return key, nil, true
	}
	if !h.readBodyInto(w, r, &body) {
		return "", nil, false
	}
	key, err := h.m.cfg.Key(r, body)
	if err == nil && key != "" {
		err = idem.ValidateKey(key)
	}
	if err != nil {
		h.refuse(w, r, ProblemInvalidKey, err.Error())
		return "", nil, false
	}
	return key, body, true
}

// refuseMissingKey answers a request that needs a key and has none.
func (h *handler) refuseMissingKey(w http.ResponseWriter, r *http.Request) {
	detail := "this request needs an " + HeaderKey + " header"
	if h.m.cfg.Key != nil {
		detail = "this request needs an idempotency key"
	}
	h.refuse(w, r, ProblemMissingKey, detail)
}

// readBodyInto reads the body into *body; see readBody.
func (h *handler) readBodyInto(w http.ResponseWriter, r *http.Request, body *[]byte) bool {
	b, ok := h.readBody(w, r)
	*body = b
	return ok
}

// warnReplaced logs a response whose status the handler replaced after it
// had begun to answer (see NewMiddleware): net/http would have sent the
// first status, here the later one is the answer.
func (h *handler) warnReplaced(r *http.Request, c *capture) {
	if c.replaced == 0 || h.m.log == nil {
		return
	}
	h.m.log.WarnContext(r.Context(), "idemhttp: the handler wrote a status after its response had begun; the later status replaces the response",
		"method", r.Method, "path", r.URL.Path, "first", c.replaced, "status", c.status)
}

// noStoredSuccess answers a success the handler marked with NoStore: its
// writes rolled back, so the client must not receive it.
func (h *handler) noStoredSuccess(w http.ResponseWriter, r *http.Request, status int) int {
	detail := "the request could not be processed; nothing was committed"
	if h.m.log != nil {
		h.m.log.WarnContext(r.Context(), "idemhttp: the handler called NoStore on a success response; its writes rolled back and the client receives 500 instead",
			"method", r.Method, "path", r.URL.Path, "status", status)
	}
	return h.problem(w, r, ProblemInternal, detail)
}

// answer writes the response for how the call ended and returns its status.
func (h *handler) answer(w http.ResponseWriter, r *http.Request, ctx context.Context, captured *capture, stored response, outcome idem.Outcome, err error) int {
	switch {
	case outcome == idem.OutcomeReplayed:
		return stored.writeTo(w, true, h.m.replaySet)
	case err == nil || outcome == idem.OutcomeRefused || errors.Is(err, errNotStored):
		return captured.full().writeTo(w, false, nil)
	case errors.Is(err, errResponseTooLarge) || errors.Is(err, idem.ErrResultTooLarge):
		return h.fail(w, r, ProblemResponseTooLarge, fmt.Sprintf("the response exceeds %d bytes and was not stored; nothing was committed", h.m.cfg.MaxResponseBytes), err)
	}
	typ, detail := callProblem(outcome, err, ctx.Err() != nil)
	return h.failOrRefuse(w, r, typ, detail, err)
}

// failOrRefuse answers with the problem typ: a 5xx through fail, which
// reports err, anything else through problem.
func (h *handler) failOrRefuse(w http.ResponseWriter, r *http.Request, typ, detail string, err error) int {
	if problemStatus[typ] >= 500 {
		return h.fail(w, r, typ, detail, err)
	}
	return h.problem(w, r, typ, detail)
}

// observer is the Observer the middleware's calls report to.
func (h *handler) observer() idem.Observer { return h.m.observer }

// readBody reads the whole body within the limit, before any database work,
// and puts it back for the handler. It answers the request itself (413, or
// 400 for an unreadable body) and reports false when it cannot.
func (h *handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Body == nil {
		r.Body = http.NoBody
	}
	limit := h.m.cfg.MaxBodyBytes
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			h.refuse(w, r, ProblemBodyTooLarge, fmt.Sprintf("the body exceeds %d bytes", limit))
		} else {
			h.refuse(w, r, ProblemInvalidRequest, "the body could not be read")
		}
		return nil, false
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, true
}

// refuse answers a request the middleware turns away before any call, and
// reports it to the observer as invalid input.
func (h *handler) refuse(w http.ResponseWriter, r *http.Request, typ, detail string) {
	obs := newObservation(h.m, h.observer())
	if obs != nil {
		obs.start(r)
	}
	status := h.problem(w, r, typ, detail)
	if obs != nil {
		obs.invalid(status, typ)
	}
}

// problem writes one of the middleware's own answers and returns its status.
func (h *handler) problem(w http.ResponseWriter, r *http.Request, typ, detail string) int {
	return writeProblem(w, r, &h.m.cfg, typ, detail)
}

// fail writes a 5xx of the middleware's own and reports its cause, which
// the client never sees, to the logger and the error callback.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, typ, detail string, cause error) int {
	status := h.problem(w, r, typ, detail)
	p := h.m.cfg.problemFor(typ, detail)
	level := levelError
	if r.Context().Err() != nil {
		level = levelWarn // the client left; nobody waits for this answer
	}
	h.m.report(r, p, cause, level)
	return status
}
