package unary

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// ErrNoScope is ContextScope's error for a call whose context carries no
// scope.
var ErrNoScope = errors.New("the call's context carries no scope")

// ContextScope returns the scope an authentication interceptor put in ctx
// with idem.ContextWithScope, or ErrNoScope.
func ContextScope(ctx context.Context) (string, error) {
	scope, ok := idem.ScopeFromContext(ctx)
	if !ok {
		return "", ErrNoScope
	}
	return scope, nil
}

type txKey struct{}

// withTx returns ctx carrying the call's transaction for Tx.
func withTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// Tx returns the transaction of the covered call whose handler runs with
// ctx, or nil.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// mergeValues is a context with the deadline and cancellation of done and
// the values of values: the handler ends when its client leaves (done is
// the call's context) and sees what idem.Run added (values carries the
// call's key and the observer's span, on top of the call's own values).
func mergeValues(done, values context.Context) context.Context {
	return valuesFrom{Context: done, values: values}
}

type valuesFrom struct {
	context.Context
	values context.Context
}

func (c valuesFrom) Value(key any) any { return c.values.Value(key) }

// owned is the transaction a handler is given for an unkeyed call: the
// server commits or rolls it back, so the handler's own Commit and Rollback
// fail with idem.ErrTxOwned instead of ending it under the server.
type owned struct{ pgx.Tx }

func (owned) Commit(context.Context) error   { return idem.ErrTxOwned }
func (owned) Rollback(context.Context) error { return idem.ErrTxOwned }

// rollbackTimeout bounds a rollback made after ctx may have ended: it runs
// on a context of its own so that a cancelled call still frees its
// connection.
const rollbackTimeout = 5 * time.Second

func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
}
