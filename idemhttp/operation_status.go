package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemhq/idem/idem"
)

// ServeStatus answers the status URL of an operation (the Location of a
// 202 Accepted; OperationOptions.StatusURL): mount it on that route, for
// GET, as in mux.HandleFunc("GET /charges/operations/{key}",
// h.ServeStatus). The key comes from OperationOptions.StatusKey, the scope
// from the poll's own credentials by the same rule as ServeHTTP
// (Config.Scope or SharedKeys): a poll without a principal is answered 401,
// and a principal only ever sees what its own scope holds, so another
// principal's key is answered 404 like a key never used. It reads the key
// with Client.Lookup and changes nothing. Every answer carries
// Cache-Control: no-store:
//
//   - the operation is unfinished, or a request holds the key: 202
//     Accepted with Retry-After (Config.RetryAfter) and no body; poll
//     again.
//   - it finished with a result: the answer ServeHTTP gives a replay of it
//     (OperationOptions.Status and Encode), with Idempotent-Replayed: true.
//   - it finished with a refusal: ProblemRefused, as ServeHTTP answers it,
//     with Idempotent-Replayed: true.
//   - the key holds nothing in the scope, or its answer expired: 404
//     (ProblemNotFound).
//   - the database cannot be read: 503 (ProblemUnavailable); a stored
//     answer that cannot be read back: 500 (ProblemInternal).
//
// The key's row does not say which operation stored it: a key the same
// principal used on another route (with Do, or another operation) answers
// with what that call stored, or 500 if it does not decode as Resp.
func (o *OperationHandler[Req, Resp]) ServeStatus(w http.ResponseWriter, r *http.Request) {
	h := o.h
	// Every answer is the state of the moment, the final result too: a
	// cache must not keep it for another principal, nor a 202 past it.
	w.Header().Set("Cache-Control", "no-store")
	key, err := o.opts.StatusKey(r)
	if err == nil && key == "" {
		h.refuse(w, r, ProblemMissingKey, "the status URL names no idempotency key")
		return
	}
	if err == nil {
		err = idem.ValidateKey(key)
	}
	if err != nil {
		h.refuse(w, r, ProblemInvalidKey, err.Error())
		return
	}
	ctx, ok := h.scope(w, r)
	if !ok {
		return
	}
	rec, err := o.client.Lookup(ctx, scopeOf(ctx), key)
	switch {
	case errors.Is(err, idem.ErrNotFound) || err == nil && rec.Expired(time.Now()):
		h.problem(w, r, ProblemNotFound, "no operation is stored under this key for this principal")
	case errors.Is(err, idem.ErrCorruptRecord):
		h.fail(w, r, ProblemInternal, "the operation's answer cannot be read back", err)
	case err != nil && (idem.Retryable(err) || ctx.Err() != nil):
		h.fail(w, r, ProblemUnavailable, "the operation's state could not be read; retry later", err)
	case err != nil:
		h.fail(w, r, ProblemInternal, "the operation's state could not be read", err)
	case rec.Status == idem.StatusUnfinished || rec.Status == idem.StatusInProgress:
		hd := w.Header()
		hd.Set("Cache-Control", "no-store")
		setRetryAfter(hd, h.m.cfg.RetryAfter)
		w.WriteHeader(http.StatusAccepted)
	case rec.Sealed:
		h.fail(w, r, ProblemInternal, "the operation's answer cannot be read back",
			errors.New("idemhttp: the answer is sealed and the handler's Client has no Sealer; give it the Client the operation was made with"))
	case rec.Refusal != nil:
		writeRefusal(w, r, &h.m.cfg, rec.Refusal, true)
	default:
		v, err := idem.DecodeResult[Resp](rec)
		if err != nil {
			h.fail(w, r, ProblemInternal, "the operation's answer cannot be read back", fmt.Errorf("idemhttp: operation %q: %w", o.op.Name(), err))
			return
		}
		o.respond(w, r, v, true)
	}
}
