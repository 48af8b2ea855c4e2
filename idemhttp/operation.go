package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// OperationOptions are the settings of an operation handler that depend on
// its request and result types. The zero value means the defaults each
// field states.
type OperationOptions[Req, Resp any] struct {
	// Decode reads the operation's request from the HTTP request; body is
	// the whole body, within Config.MaxBodyBytes. What it returns is what
	// the operation stores and hashes: a retry whose Decode returns an
	// equal request replays, one that returns another request is answered
	// 422 (ProblemKeyMismatch), whatever else differs between the two HTTP
	// requests. An error is answered 400 (ProblemInvalidRequest) with a
	// fixed detail (an error's text may repeat client input); nothing is
	// stored and the key stays free. Defaults to decoding body as one JSON
	// document into Req, refusing unknown fields and trailing data, so a
	// misspelt field is an error rather than a zero the operation acts on.
	Decode func(r *http.Request, body []byte) (Req, error)

	// Status is the status of the operation's answer: the first, its
	// replays, and the status URL's once the operation finished. It must
	// depend on resp alone, so that every one of them is alike, and
	// return a 2xx or 3xx: anything else is answered 500 (ProblemInternal)
	// and logged. Defaults to 200 OK.
	Status func(resp Resp) int

	// Encode sets the headers of the operation's answer on h (its
	// Content-Type, a Location naming what it created) and returns its
	// body. It must depend on resp alone, as Status. An error is answered
	// 500 (ProblemInternal) and logged; the answer stays stored. Defaults
	// to resp as JSON, with Content-Type application/json.
	Encode func(h http.Header, resp Resp) ([]byte, error)

	// Accepted makes every request that finds its operation in progress,
	// or that stopped before the operation's end, answered 202 Accepted
	// with a Location to poll (StatusURL) instead of 409 or 5xx. Without
	// it, only requests that ask for it with Prefer: respond-async (RFC
	// 7240) are. Requires StatusURL. Defaults to false.
	Accepted bool

	// StatusURL returns the URL a 202 Accepted names in Location: where
	// ServeStatus answers for the operation ref. The key is client text,
	// so escape it (url.PathEscape); leave the scope out, since
	// ServeStatus takes it from the poll's own credentials (Config.Scope)
	// and a URL is no credential. The key appears in access logs of the
	// URL; the scope, not the key, guards the answer. An empty URL means
	// no 202 for that request. Defaults to none: no request is answered
	// 202, and Prefer: respond-async is ignored, as RFC 7240 allows.
	StatusURL func(ref idem.OperationRef) string

	// StatusKey reads the key from a request to the status URL, for
	// ServeStatus. An error, or a key that idem.ValidateKey refuses, is
	// answered 400 (ProblemInvalidKey); no key, 400 (ProblemMissingKey).
	// Defaults to the path value "key" (http.Request.PathValue), for a
	// route such as "GET /charges/operations/{key}".
	StatusKey func(r *http.Request) (string, error)
}

// An OperationHandler serves an idem.Operation over HTTP: ServeHTTP runs
// the operation for a request, and ServeStatus answers the status URL a
// 202 Accepted names. NewOperationHandler states the contract.
type OperationHandler[Req, Resp any] struct {
	h      *handler // the middleware's key, scope, body and problem rules
	client *idem.Client
	op     *idem.Operation[Req, Resp]
	opts   OperationOptions[Req, Resp]
}

// NewOperationHandler returns the handler that runs op for HTTP requests,
// under cfg and opts (nil: the defaults); the status URL reads the
// operation's answer through op's Client. It checks its arguments once: a
// nil op, a cfg without Scope or SharedKeys (nil included), an invalid
// setting, a Config field that does not apply here and Accepted without
// StatusURL are errors wrapping idem.ErrInvalidOption.
//
// The middleware's transaction cannot span an operation's steps, so an
// operation is served by a handler of its own rather than under the
// middleware (mount it on a route the middleware does not cover). It
// shares the middleware's rules: the key is read from the Idempotency-Key
// header (or by Config.Key) and is required, as if Config.Required were
// set; the scope comes from Config.Scope, or with Config.SharedKeys from
// the context, and a request without one is refused (fail closed); the
// body is read within Config.MaxBodyBytes; the handler's own answers are
// the middleware's problems (Config.ProblemBase, Config.WriteProblem),
// with Retry-After on 409 and 503 (Config.RetryAfter), and its 5xx go to
// Config.Logger and Config.OnError. The Config fields that decide what the
// middleware's single transaction stores do not apply and are refused:
// Methods (route by method in the mux), Fingerprint and
// FingerprintHeaders (the decoded request is what a retry must repeat),
// MaxResponseBytes (idem.Config.MaxResultBytes bounds the answer),
// ReplayHeaders (every answer is encoded afresh by OperationOptions.Encode),
// StoreStatus (the operation stores its result or its refusal), Wait (a
// duplicate is answered at once), TxOptions (each step begins a
// transaction of its own) and Observer (the operation's calls report to
// its Client's Observer, without HTTPStatus).
//
// A request is decoded (OperationOptions.Decode) and handed to op.Run with
// its key, in its scope, and answered by how the call ended:
//
//   - executed: OperationOptions.Status and Encode of the result.
//   - replayed: the same, from the stored result, with Idempotent-Replayed:
//     true; the operation did not run.
//   - refused (an *idem.Refusal), first or replayed: ProblemRefused, with the
//     refusal's 4xx status (422 when it names none), its code and message;
//     replays carry Idempotent-Replayed: true.
//   - another owner is at work (idem.ErrInProgress): 409 (ProblemInProgress).
//   - a different request under the key (idem.ErrMismatch): 422
//     (ProblemKeyMismatch).
//   - a request Decode accepted but that cannot be stored or hashed
//     exactly (a string that is not valid UTF-8; two object keys equal
//     under case folding): 400 (ProblemInvalidRequest), as the middleware
//     answers a body it cannot fingerprint; nothing runs.
//   - the connection failed while the answer was being stored
//     (idem.ErrOutcomeUnknown): 503 (ProblemOutcomeUnknown).
//   - the operation stopped before its end on an error worth retrying
//     (idem.Retryable: a lost lease, the database) or because the client
//     left: 503 (ProblemUnavailable); on any other error (a step's own,
//     say), 500 (ProblemInternal). Either way what its steps recorded
//     stays, and a retry with the same key continues from there. A result
//     above idem.Config.MaxResultBytes: 500 (ProblemResponseTooLarge).
//
// A request that asks for it with Prefer: respond-async, or every request
// when OperationOptions.Accepted is set, is answered 202 Accepted instead of
// 409, and instead of the 503 or 500 of an operation that stopped and stays
// unfinished: with Location (OperationOptions.StatusURL), Retry-After, and
// Preference-Applied: respond-async when the preference was honoured, and
// no body. The client polls the Location (ServeStatus) until the answer is
// stored; the operation is finished meanwhile by its owner, a retry, or
// the completer. A request that finds the key free still runs the
// operation before it is answered: respond-async changes what a waiting
// client receives, not when the work runs.
//
// The operation runs on the request's context: when the client leaves, it
// stops at its next step and stays unfinished, for a retry or the
// completer. A panic in the operation's function propagates, as in a
// plain handler, and leaves the operation unfinished.
func NewOperationHandler[Req, Resp any](op *idem.Operation[Req, Resp], cfg *Config, opts *OperationOptions[Req, Resp]) (*OperationHandler[Req, Resp], error) {
	bad := func(format string, args ...any) (*OperationHandler[Req, Resp], error) {
		return nil, fmt.Errorf("%w: idemhttp: operation handler: %s", idem.ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	if op == nil {
		return bad("nil Operation")
	}
	client := op.Client()
	if cfg != nil {
		if err := notForOperations(cfg); err != "" {
			return bad("%s", err)
		}
	}
	o := &OperationHandler[Req, Resp]{client: client, op: op}
	if opts != nil {
		o.opts = *opts
	}
	if o.opts.Accepted && o.opts.StatusURL == nil {
		return bad("Accepted needs StatusURL, the Location a 202 names")
	}
	// The middleware's own checks and defaults: the same messages for the
	// same mistakes (a missing scope first of all).
	m, err := NewMiddleware(client, cfg)
	if err != nil {
		return nil, err
	}
	o.h = &handler{m: m}
	if o.opts.Decode == nil {
		o.opts.Decode = decodeJSON[Req]
	}
	if o.opts.Status == nil {
		o.opts.Status = func(Resp) int { return http.StatusOK }
	}
	if o.opts.Encode == nil {
		o.opts.Encode = encodeJSON[Resp]
	}
	if o.opts.StatusKey == nil {
		o.opts.StatusKey = func(r *http.Request) (string, error) { return r.PathValue("key"), nil }
	}
	return o, nil
}

// notForOperations names the first Config field set that does not apply
// to an operation handler, and why, or returns "".
func notForOperations(c *Config) string {
	switch {
	case len(c.Methods) > 0:
		return "Config.Methods does not apply: the handler answers every request routed to it (route by method: \"POST /charges\")"
	case c.Fingerprint != nil || len(c.FingerprintHeaders) > 0:
		return "Config.Fingerprint and FingerprintHeaders do not apply: the decoded request (OperationOptions.Decode) is what a retry must repeat"
	case c.MaxResponseBytes != 0:
		return "Config.MaxResponseBytes does not apply: the operation's result is bounded by idem.Config.MaxResultBytes"
	case len(c.ReplayHeaders) > 0:
		return "Config.ReplayHeaders does not apply: every answer is encoded from the stored result (OperationOptions.Encode)"
	case c.StoreStatus != nil:
		return "Config.StoreStatus does not apply: the operation stores its result or its refusal"
	case c.Wait != 0:
		return "Config.Wait does not apply: a request that finds the operation at work is answered at once (409, or 202 with OperationOptions.StatusURL)"
	case c.TxOptions != (pgx.TxOptions{}):
		return "Config.TxOptions does not apply: each step of the operation begins a transaction of its own"
	case c.Observer != nil:
		return "Config.Observer does not apply: the operation's calls report to its Client's Observer"
	}
	return ""
}

// ServeHTTP runs the operation for r, or answers from what its key holds,
// as NewOperationHandler states.
func (o *OperationHandler[Req, Resp]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := o.h
	key, body, ok := h.readKey(w, r)
	if !ok {
		return
	}
	if key == "" {
		h.refuseMissingKey(w, r)
		return
	}
	ctx, ok := h.scope(w, r)
	if !ok {
		return
	}
	if h.m.cfg.Key == nil && !h.readBodyInto(w, r, &body) {
		return
	}
	req, err := o.opts.Decode(r, body)
	if err != nil {
		h.refuse(w, r, ProblemInvalidRequest, "the body is not a valid request for this operation")
		return
	}
	resp, outcome, err := o.op.Run(ctx, key, req)
	if err == nil && (outcome == idem.OutcomeExecuted || outcome == idem.OutcomeReplayed) {
		o.respond(w, r, resp, outcome == idem.OutcomeReplayed)
		return
	}
	if refusal, ok := storedRefusal(outcome, err); ok {
		writeRefusal(w, r, &h.m.cfg, refusal, outcome == idem.OutcomeReplayed)
		return
	}
	typ, detail := callProblem(outcome, err, ctx.Err() != nil)
	switch {
	case typ == ProblemInProgress && o.accept(w, r, ctx, key):
	case (typ == ProblemUnavailable || typ == ProblemInternal) && outcome == idem.OutcomeFailed &&
		o.wantsAsync(r) && o.holds(ctx, key) && o.accept(w, r, ctx, key):
		// The operation stays unfinished under the key: the poll, a retry
		// or the completer takes it from here.
	default:
		h.failOrRefuse(w, r, typ, detail, err)
	}
}

// wantsAsync reports whether r is to be answered 202 rather than kept
// waiting or failed.
func (o *OperationHandler[Req, Resp]) wantsAsync(r *http.Request) bool {
	return o.opts.StatusURL != nil && (o.opts.Accepted || prefersAsync(r.Header))
}

// holds reports whether the key holds the operation (unfinished, most
// likely), after a call that stopped: a failure before the operation began
// (the database unreachable) leaves nothing to poll.
func (o *OperationHandler[Req, Resp]) holds(ctx context.Context, key string) bool {
	rec, err := o.client.Lookup(ctx, scopeOf(ctx), key)
	return err == nil && !rec.Expired(time.Now())
}

// accept answers 202 Accepted with the status URL of the operation under
// key, if r is to be answered so, and reports whether it did.
func (o *OperationHandler[Req, Resp]) accept(w http.ResponseWriter, r *http.Request, ctx context.Context, key string) bool {
	if !o.wantsAsync(r) {
		return false
	}
	loc := o.opts.StatusURL(idem.OperationRef{Operation: o.op.Name(), Scope: scopeOf(ctx), Key: key})
	if loc == "" {
		return false
	}
	h := w.Header()
	h.Set("Location", loc)
	h.Set("Cache-Control", "no-store")
	setRetryAfter(h, o.h.m.cfg.RetryAfter)
	if prefersAsync(r.Header) {
		h.Set("Preference-Applied", "respond-async")
	}
	w.WriteHeader(http.StatusAccepted)
	return true
}

// respond writes the operation's result.
func (o *OperationHandler[Req, Resp]) respond(w http.ResponseWriter, r *http.Request, resp Resp, replayed bool) {
	status := o.opts.Status(resp)
	if status < 200 || status > 399 {
		o.h.fail(w, r, ProblemInternal, "the operation's answer could not be sent",
			fmt.Errorf("idemhttp: OperationOptions.Status returned %d for a result; want a 2xx or 3xx", status))
		return
	}
	// Headers go to w only once the body is known: a failed Encode leaves
	// none behind on the problem answered instead.
	header := make(http.Header)
	body, err := o.opts.Encode(header, resp)
	if err != nil {
		o.h.fail(w, r, ProblemInternal, "the operation's answer could not be sent", fmt.Errorf("idemhttp: OperationOptions.Encode: %w", err))
		return
	}
	dst := w.Header()
	for name, values := range header {
		dst[name] = values
	}
	if replayed {
		dst.Set(HeaderReplayed, "true")
	}
	w.WriteHeader(status)
	// A write error means the client left; the outcome is already settled.
	_, _ = w.Write(body)
}

// scopeOf is the scope a request's call runs in: what the handler's scope
// rule put in its context.
func scopeOf(ctx context.Context) string {
	scope, _ := idem.ScopeFromContext(ctx)
	return scope
}

// prefersAsync reports whether the request's Prefer header (RFC 7240)
// holds the respond-async preference. Preference names are
// case-insensitive; parameters and values after it are ignored.
func prefersAsync(h http.Header) bool {
	for _, v := range h.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(pref, ";")
			name, _, _ = strings.Cut(name, "=")
			if strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return true
			}
		}
	}
	return false
}

// errTrailing is decodeJSON's error for a body with more after its JSON
// document.
var errTrailing = errors.New("idemhttp: data after the JSON document")

// decodeJSON is the default OperationOptions.Decode: body as one JSON
// document, without unknown fields.
func decodeJSON[Req any](_ *http.Request, body []byte) (Req, error) {
	var req Req
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
		return req, err
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return req, errTrailing
	}
	return req, nil
}

// encodeJSON is the default OperationOptions.Encode.
func encodeJSON[Resp any](h http.Header, resp Resp) ([]byte, error) {
	body, err := json.Marshal(resp)
	if err != nil {
		return nil, err
	}
	h.Set("Content-Type", "application/json")
	return body, nil
}
