package idemgrpc

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idemgrpc/internal/unary"
)

// Tx returns the transaction of the covered call whose handler runs with
// ctx: with a key, the transaction that commits with the key; without one,
// a plain transaction. It returns nil outside a covered call (another
// method, a streaming call). The handler must not commit or roll it back.
//
// Tx also finds the transaction of a call served by idemconnect.
func Tx(ctx context.Context) pgx.Tx { return unary.Tx(ctx) }

// ContextScope is a Config.Scope function that returns the scope an
// authentication interceptor running before this one put in the call's
// context with idem.ContextWithScope. A call whose context carries none (a
// method the authentication interceptor skips, say) has no principal: it is
// answered UNAUTHENTICATED (ReasonUnauthenticated) and the handler does not
// run.
func ContextScope(ctx context.Context) (string, error) { return unary.ContextScope(ctx) }
