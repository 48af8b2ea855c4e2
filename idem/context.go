package idem

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// ctxKey is the key under which a context carries idem's value of type T:
// one key per type (the scope's string, the call's CallKey).
type ctxKey[T any] struct{}

func withValue[T any](ctx context.Context, v T) context.Context {
	return context.WithValue(ctx, ctxKey[T]{}, v)
}

func valueOf[T any](ctx context.Context) (T, bool) {
	v, ok := ctx.Value(ctxKey[T]{}).(T)
	return v, ok
}

// ContextWithScope returns a context that carries scope: Do, Run, Wrap and
// idemhttp store and look up keys of calls made with it in that namespace.
// The same key in two scopes is two unrelated keys, so one principal can
// never replay another's stored result: put the authenticated principal or
// tenant here, once, in the middleware that authenticates the request.
//
// The scope is checked when a call uses it (see ValidateScope), never here:
// an invalid scope makes that call fail with ErrInvalidScope.
func ContextWithScope(ctx context.Context, scope string) context.Context {
	return withValue(ctx, scope)
}

// ScopeFromContext returns the scope ContextWithScope put in ctx, and
// whether there was one.
func ScopeFromContext(ctx context.Context) (string, bool) { return valueOf[string](ctx) }

// A CallKey names the key of a call: the scope it is stored under and the
// key itself. Inside the work of a call, KeyFromContext returns it.
type CallKey struct {
	// Scope is the namespace the key is stored under. For Wrap it encodes
	// the operation and the caller's scope (see Wrap).
	Scope string
	// Key is the idempotency key the client sent.
	Key string
	// Run is set inside an Operation: the identity of its current run
	// (Steps.Run), new each time the operation begins under a free key
	// (first use, after the key expired, after Forget) and kept by every
	// retry and takeover of that run. Derive includes it, so a new request
	// under a reused key never derives an old request's downstream key.
	// Empty for Do, Run, Wrap and idemhttp.
	Run string
}

// contextWithKey returns a context that carries k, for the work of a call.
func contextWithKey(ctx context.Context, k CallKey) context.Context { return withValue(ctx, k) }

// KeyFromContext returns the key of the call whose work runs with ctx, and
// whether there is one: inside fn of Run, a method run by Wrap, or a handler
// run by idemhttp. Do's fn takes no context; it has the key at hand.
func KeyFromContext(ctx context.Context) (CallKey, bool) { return valueOf[CallKey](ctx) }

// Derive returns the idempotency key to send to a downstream service (a
// payment processor, a bank) for the given purpose ("charge", "settle"):
// the same call key and purpose always give the same derived key, so every
// retry of the request, and every rerun of its work after a rollback, sends
// the same key downstream, and the downstream service charges once.
// Different scopes, keys, runs or purposes give unrelated keys.
//
// The result is a UUID string (RFC 9562 version 8, built from SHA-256 of a
// versioned, length-prefixed encoding of scope, key and purpose, and of Run
// when it is set): 36 characters that any service accepting UUID keys
// accepts. Its derivation is part of the contract and will not change,
// since a change would make a retry after an upgrade send a new key
// downstream.
//
// Without Run (Do, Run, Wrap, idemhttp), a derived key outlives the call's
// key: a client that sends the same key again after it expired
// (Config.TTL) runs the work again, and the work derives the same
// downstream key, which the downstream service may still remember, for
// another request. When the work knows an identifier of what the call is
// about (an order or payment id it has just inserted), put it in purpose
// ("payments/settle/42"); otherwise keep the TTL at least as long as the
// downstream service keeps its keys. Inside an Operation, Run makes the
// derived key new for every run of the operation (see External). The key
// is not a secret: anyone who knows its parts can compute it.
// docs/EXTERNAL_EFFECTS.md says when a downstream call with it is safe.
func (k CallKey) Derive(purpose string) string {
	h := sha256.New()
	parts := []string{k.Scope, k.Key, purpose}
	if k.Run == "" {
		h.Write([]byte("idem/derive/v1"))
	} else {
		h.Write([]byte("idem/derive/run/v1"))
		parts = []string{k.Scope, k.Key, k.Run, purpose}
	}
	for _, part := range parts {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		h.Write([]byte(part))
	}
	var sum [sha256.Size]byte
	return formatUUID(h.Sum(sum[:0])[:16], 0x80)
}

// formatUUID sets the version (the high nibble of version: 0x40 random,
// 0x80 custom) and the RFC 9562 variant on the 16 bytes u and formats them.
func formatUUID(u []byte, version byte) string {
	u[6] = u[6]&0x0f | version
	u[8] = u[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], u[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], u[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], u[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], u[8:10])
	out[23] = '-'
	hex.Encode(out[24:], u[10:16])
	return string(out[:])
}

// newRunID returns a new random UUID (version 4): the identity of an
// operation's run.
func newRunID() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails (Go 1.24)
	return formatUUID(u[:], 0x40)
}

// DeriveKey returns KeyFromContext(ctx).Derive(purpose): the downstream key
// for purpose of the call whose work runs with ctx. Outside such work it
// returns ErrNoKey.
func DeriveKey(ctx context.Context, purpose string) (string, error) {
	k, ok := KeyFromContext(ctx)
	if !ok {
		return "", ErrNoKey
	}
	return k.Derive(purpose), nil
}
