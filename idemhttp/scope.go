package idemhttp

import (
	"context"
	"errors"
	"net/http"

	"github.com/idemhq/idem/idem"
)

// errNoScope is ContextScope's error for a request whose context carries no
// scope.
var errNoScope = errors.New("idemhttp: the request's context carries no scope")

// ContextScope is a Config.Scope function that returns the scope an
// authentication middleware in front of the middleware put in the
// request's context with idem.ContextWithScope. A request whose context
// carries none (a route left outside the authentication middleware, say)
// has no principal: it is answered 401 (ProblemUnauthorized) and the
// handler does not run.
func ContextScope(r *http.Request) (string, error) {
	scope, ok := idem.ScopeFromContext(r.Context())
	if !ok {
		return "", errNoScope
	}
	return scope, nil
}

// scope returns the context of a keyed request's call, carrying the key's
// scope (Config.Scope and Config.SharedKeys). It answers the request itself
// and reports false when the request has no usable scope.
func (h *handler) scope(w http.ResponseWriter, r *http.Request) (context.Context, bool) {
	ctx := r.Context()
	var scope string
	if h.m.cfg.Scope != nil {
		var err error
		scope, err = h.m.cfg.Scope(r)
		if err != nil || scope == "" {
			// Fail closed: without a principal, the key would be shared
			// with every client that has none.
			h.refuse(w, r, ProblemUnauthorized, "the request has no principal to scope its key by")
			return nil, false
		}
		ctx = idem.ContextWithScope(ctx, scope)
	} else {
		// SharedKeys: the context's scope, or the empty one.
		scope, _ = idem.ScopeFromContext(ctx)
	}
	if err := idem.ValidateScope(scope); err != nil {
		h.refuse(w, r, ProblemInvalidRequest, "the request's principal cannot scope an idempotency key: "+err.Error())
		return nil, false
	}
	return ctx, true
}
