package idemclient

import (
	"context"
	"net/http"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is the response header with which a server (idem's
// idemhttp, Stripe) marks an answer replayed from a stored result.
const HeaderReplayed = "Idempotent-Replayed"

type keyCtx struct{}

// ContextWithKey returns a copy of ctx that carries key as the idempotency
// key of the logical operation made with it: the Transport (and the gRPC
// interceptor of package grpcclient) send it instead of making one. Use it
// when the key must outlive the process, such as a key stored with an order
// so that a restarted worker retries with the same one. An empty key is
// ignored.
func ContextWithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// KeyFromContext returns the key ContextWithKey put in ctx, or "".
func KeyFromContext(ctx context.Context) string {
	key, _ := ctx.Value(keyCtx{}).(string)
	return key
}

// RequestKey returns the Idempotency-Key to send req with, on its first
// attempt and every retry: the header req already carries, sent as it is;
// else, for a POST or PATCH, the key of req's context (ContextWithKey) or
// a new key (NewKey), as an RFC 8941 string in double quotes, the form
// the IETF draft gives the header; else "": other methods are idempotent
// by definition and are sent without a key of their own. Call it once per
// logical request.
func (p *Policy) RequestKey(req *http.Request) (string, error) {
	if key := req.Header.Get(HeaderKey); key != "" {
		return key, nil
	}
	if req.Method != http.MethodPost && req.Method != http.MethodPatch {
		return "", nil
	}
	key := KeyFromContext(req.Context())
	if key == "" {
		var err error
		if key, err = p.NewKey(); err != nil {
			return "", err
		}
	}
	return `"` + key + `"`, nil
}
