package idem

import (
	"context"
	"reflect"

	"github.com/jackc/pgx/v5"
)

// Wrap turns a transactional service method into an idempotent one.
//
// method does its work through the transaction it is given, with a context
// that carries the call's key (KeyFromContext, CallKey.Derive). The
// returned function hashes req with HashJSON, stores the key under the
// operation within the caller's scope (from ctx, see ContextWithScope), and
// runs method through Run, whose results it returns: the response, how the
// call ended (OutcomeReplayed for a stored answer, so that an HTTP handler
// can set Idempotent-Replayed), and the error. Errors are those of Do and of
// method.
//
//	charge := idem.Wrap(keys, "payments.charge", svc.Charge) // once, at start-up
//	...
//	ctx = idem.ContextWithScope(ctx, tenantID)              // per request
//	payment, outcome, err := charge(ctx, key, ChargeRequest{AccountID: 1, Amount: 500})
//
// Keys of different operations never meet: the scope a key is stored under
// encodes the operation and the caller's scope unambiguously (as
// "\x1f" + operation + "\x1f" + scope, with unit separators that no valid
// scope or operation holds), so no two (operation, scope) pairs share
// keys, and no plain scope given to Do or idemhttp equals a Wrap scope. The
// operation and the scope together must fit in 253 bytes; otherwise the call
// fails with ErrInvalidScope.
//
// Req is fingerprinted through its JSON encoding, so a request type whose
// JSON leaves something out (an unexported or `json:"-"` field) is refused:
// two requests differing only there would share a key's result.
//
// Wrap never panics. An invalid db, operation, method or option makes every
// call of the returned function fail, before any database work, with an
// error wrapping ErrInvalidOption.
// Build wrapped methods once, at start-up, and check them there with one
// call if a bad configuration must stop the process.
func Wrap[Req, Resp any](db Beginner, operation string, method func(ctx context.Context, tx pgx.Tx, req Req) (Resp, error), opts ...Option) func(ctx context.Context, key string, req Req) (Resp, Outcome, error) {
	inner, base := resolve(db)
	s := base.with(opts, useWrap)
	switch {
	case db == nil || method == nil:
		s.fail(inputError(ErrInvalidOption, "Wrap needs a database and a method"))
	case operation == "":
		s.fail(inputError(ErrInvalidOption, "Wrap needs an operation name"))
	default:
		if err := validateText(ErrInvalidOption, operation); err != nil {
			s.fail(err)
		}
	}
	if problem := checkType(reflect.TypeFor[Req](), reflect.TypeFor[Req]().String(), forFingerprint, map[reflect.Type]bool{}); problem != "" {
		// What JSON leaves out of req is left out of its fingerprint: two
		// requests differing only there would share a key's result.
		s.fail(inputError(ErrInvalidOption, "request type %v cannot be fingerprinted exactly: %s", reflect.TypeFor[Req](), problem))
	}
	s.operation = operation
	return func(ctx context.Context, key string, req Req) (Resp, Outcome, error) {
		call := s // per call: the request hash's failure is the call's own
		hash, err := HashJSON(req)
		if err != nil {
			call.fail(inputError(ErrInvalidOption, "%v", err))
		}
		return runSettled[Resp](ctx, inner, &call, key, hash, wrapped[Req, Resp]{method, req})
	}
}

// wrapped is a Wrap'd method with its request, as the work of a call.
type wrapped[Req, Resp any] struct {
	method func(ctx context.Context, tx pgx.Tx, req Req) (Resp, error)
	req    Req
}

func (w wrapped[Req, Resp]) call(ctx context.Context, c *call, tx pgx.Tx) (Resp, error) {
	return w.method(contextWithKey(ctx, CallKey{Scope: c.scope, Key: c.key}), tx, w.req)
}

func (w wrapped[Req, Resp]) valid() bool { return w.method != nil }

// wrapScope is the scope Wrap stores operation's keys under for scope. The
// unit separators cannot occur in a valid operation or scope, which makes
// the encoding injective and distinct from every plain scope.
func wrapScope(operation, scope string) (string, error) {
	s := "\x1f" + operation + "\x1f" + scope
	if len(s) > MaxKeyLen {
		return "", inputError(ErrInvalidScope, "operation %q and a scope of %d bytes together exceed %d bytes", operation, len(scope), MaxKeyLen-2)
	}
	return s, nil
}

// WrapScope returns the scope that Wrap stores operation's keys under for a
// caller scope, for Lookup and Forget.
func WrapScope(operation, scope string) (string, error) {
	if err := validateText(ErrInvalidOption, operation); err != nil || operation == "" {
		return "", inputError(ErrInvalidOption, "invalid operation %q", operation)
	}
	if err := ValidateScope(scope); err != nil {
		return "", err
	}
	return wrapScope(operation, scope)
}
