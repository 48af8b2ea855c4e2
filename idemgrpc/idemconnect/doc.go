// Package idemconnect makes unary Connect procedures
// (connectrpc.com/connect) safe to retry, with the rules of idemgrpc: the
// client's idempotency key, the handler's database writes and its answer
// commit in one PostgreSQL transaction, through idem.Run. A retry with the
// same key never runs the handler twice: it receives the stored response
// (or stored error), marked with the Idempotent-Replayed header, or
// aborted while the first call still runs. It serves the Connect, gRPC and
// gRPC-Web protocols alike.
//
// The key comes from the Idempotency-Key header or, per procedure, from a
// request field such as AIP-155's request_id. Keys are scoped by the
// authenticated caller, so one caller's key never replays another's answer:
// the interceptor requires Config.Scope (ContextScope reads the scope an
// authentication interceptor put in the context with
// idem.ContextWithScope), and refuses a keyed call without a principal.
// Only Config.SharedKeys, an explicit opt-in, puts every client in one key
// space.
//
//	intercept, err := idemconnect.NewInterceptor(keys, &idemconnect.Config{
//		Methods: map[string]idemconnect.Method{
//			chargev1connect.ChargeServiceChargeProcedure: {KeyField: "request_id"},
//		},
//		Scope: idemconnect.ContextScope, // set by auth
//	})
//	path, handler := chargev1connect.NewChargeServiceHandler(svc,
//		connect.WithInterceptors(auth, intercept))
//
//	func (s *service) Charge(ctx context.Context, req *connect.Request[chargev1.ChargeRequest]) (*connect.Response[chargev1.ChargeResponse], error) {
//		var balance int64
//		err := idemconnect.Tx(ctx).QueryRow(ctx, `UPDATE accounts SET balance = balance - $2
//			WHERE id = $1 AND balance >= $2 RETURNING balance`, req.Msg.AccountId, req.Msg.Amount).Scan(&balance)
//		if errors.Is(err, pgx.ErrNoRows) {
//			return nil, connect.NewError(connect.CodeFailedPrecondition, errInsufficientFunds) // stored, replayed
//		}
//		...
//	}
//
// A handler's error reaches the client as Connect sends it by default: its
// code, its details, and its message, which is the raw text of the error
// the handler returned (a *connect.Error's underlying error, or any other
// error's Error(), sent as unknown). A stored error is replayed to every
// retry with that same text. Return errors whose text is fit for the
// client, never a database error's or a wrapped cause's.
//
// The package imports connectrpc.com/connect and not google.golang.org/grpc:
// a Connect service builds no gRPC. Streaming procedures pass through
// untouched.
package idemconnect
