package idem

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Wrap turns a transactional service method into an idempotent one.
//
// method does its work through the transaction it is given. The returned
// function hashes req with HashJSON, scopes the key by operation (joined
// after any WithScope, as "scope/operation"), and runs method through Do
// with opts. A key used for one operation therefore never replays another
// operation's result. Errors are those of Do and of method.
//
//	charge := idem.Wrap(pool, "payments.charge", svc.Charge)
//	payment, err := charge(ctx, key, ChargeRequest{AccountID: 1, Amount: 500})
//
// Wrap validates operation and opts when it is called, and panics if they
// are invalid: a wrong decorator is a programming error, found at start-up.
func Wrap[Req, Resp any](db Beginner, operation string, method func(ctx context.Context, tx pgx.Tx, req Req) (Resp, error), opts ...Option) func(ctx context.Context, key string, req Req) (Resp, error) {
	cfg := newConfig(opts)
	scope := operation
	if cfg.scope != "" {
		scope = cfg.scope + "/" + operation
	}
	if operation == "" || method == nil || db == nil {
		panic("idem.Wrap: need a database, an operation name and a method")
	}
	if cfg.err != nil {
		panic(cfg.err)
	}
	if err := validateScope(scope); err != nil {
		panic(err)
	}
	if _, err := statementsFor(cfg.table); err != nil {
		panic(err)
	}
	all := append(append(make([]Option, 0, len(opts)+1), opts...), WithScope(scope))
	return func(ctx context.Context, key string, req Req) (Resp, error) {
		hash, err := HashJSON(req)
		if err != nil {
			var zero Resp
			return zero, err
		}
		return Do(ctx, db, key, hash, func(tx pgx.Tx) (Resp, error) {
			return method(ctx, tx, req)
		}, all...)
	}
}
