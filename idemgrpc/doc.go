// Package idemgrpc makes unary gRPC methods safe to retry: the client's
// idempotency key, the handler's database writes and its answer commit in
// one PostgreSQL transaction, through idem.Run. A retry with the same key
// never runs the handler twice: it receives the stored response (or stored
// error status), marked with the idempotent-replayed header metadata, or
// ABORTED while the first call still runs.
//
// The key comes from the idempotency-key metadata or, per method, from a
// request field such as AIP-155's request_id. Keys are scoped by the
// authenticated caller, so one caller's key never replays another's answer:
// the interceptor requires Config.Scope (ContextScope reads the scope an
// authentication interceptor put in the context with
// idem.ContextWithScope), and refuses a keyed call without a principal.
// Only Config.SharedKeys, an explicit opt-in, puts every client in one key
// space.
//
//	intercept, err := idemgrpc.NewUnaryServerInterceptor(keys, &idemgrpc.Config{
//		Methods: map[string]idemgrpc.Method{
//			chargev1.ChargeService_Charge_FullMethodName: {KeyField: "request_id"},
//		},
//		Scope: idemgrpc.ContextScope, // set by auth
//	})
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, intercept))
//
//	func (s *service) Charge(ctx context.Context, req *chargev1.ChargeRequest) (*chargev1.ChargeResponse, error) {
//		var balance int64
//		err := idemgrpc.Tx(ctx).QueryRow(ctx, `UPDATE accounts SET balance = balance - $2
//			WHERE id = $1 AND balance >= $2 RETURNING balance`, req.AccountId, req.Amount).Scan(&balance)
//		if errors.Is(err, pgx.ErrNoRows) {
//			return nil, status.Error(codes.FailedPrecondition, "insufficient funds") // stored, replayed
//		}
//		...
//	}
//
// The package imports google.golang.org/grpc and not Connect; its sibling
// idemconnect serves connectrpc.com/connect handlers with the same rules
// and imports no gRPC. Streaming methods pass through untouched.
package idemgrpc
