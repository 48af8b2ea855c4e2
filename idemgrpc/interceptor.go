package idemgrpc

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemgrpc/internal/unary"
)

// NewUnaryServerInterceptor returns the interceptor on db (an *idem.Client,
// whose Config the keys use, or a pool) with cfg. It checks cfg once; an
// invalid setting, an unknown or streaming method, a KeyField that is not
// a string field, a nil db (typed nil included) and a cfg without Scope or
// SharedKeys are errors wrapping idem.ErrInvalidOption.
//
// On a covered method with a key, the interceptor fingerprints the request
// and runs the handler inside idem.Run: the handler finds the transaction
// with Tx(ctx) and the key with idem.KeyFromContext, and does its database
// writes through the transaction. Its answer decides:
//
//   - a response: the writes commit together with the key and the
//     response; a retry with the same key receives the stored response,
//     with MetadataReplayed set, without running the handler.
//   - an error whose code is stored (Config.StoreCode, DefaultStoreCode):
//     the writes roll back and the key commits with the full status,
//     details included, which every retry receives again.
//   - any other error, or a panic: everything rolls back and the key stays
//     free, so a retry runs the handler again. A panic propagates (install
//     a recovery interceptor outside this one).
//
// The interceptor answers by itself, always with an ErrorInfo detail whose
// reason is one of the Reason* constants:
//
//	key missing on a Required method        INVALID_ARGUMENT     ReasonMissingKey
//	key invalid, repeated, or two keys      INVALID_ARGUMENT     ReasonInvalidKey (+ BadRequest for KeyField)
//	same key, different request             FAILED_PRECONDITION  ReasonKeyMismatch
//	the first call with the key still runs  ABORTED + RetryInfo  ReasonInProgress
//	connection lost during COMMIT           UNAVAILABLE + RetryInfo  ReasonOutcomeUnknown
//	database unavailable, nothing stored    UNAVAILABLE + RetryInfo  ReasonUnavailable
//	no principal (Config.Scope failed)      UNAUTHENTICATED      ReasonUnauthenticated
//	answer over MaxResponseBytes            INTERNAL             ReasonResponseTooLarge
//
// ABORTED is gRPC's code for a concurrency conflict, the counterpart of
// idemhttp's 409; with the RetryInfo it tells the client to retry the same
// call later. A mismatch is FAILED_PRECONDITION rather than
// INVALID_ARGUMENT because the request is only wrong given the key's
// history, and no retry will succeed until the key expires.
//
// On a covered method without a key (and Required unset), the handler runs
// in a plain transaction, also available through Tx, that commits when it
// returns a response and rolls back when it returns an error. Calls of
// other methods pass through untouched; so do streaming calls, which a
// unary interceptor never sees.
//
// The handler's context carries the call's values, deadline and
// cancellation. Once the handler has started, the client's departure no
// longer matters: its answer is committed (or not) as it decides, and a
// retry receives it. The handler must not keep the transaction after it
// returns, nor commit or roll it back (both return idem.ErrTxOwned).
//
// What a replay returns is the stored protobuf message, decoded into its
// type through the global registry, or the stored status. Response header
// and trailer metadata the handler set is sent with the first answer only.
//
// Put the interceptor after the one that authenticates the call and sets
// its scope: grpc.ChainUnaryInterceptor(auth, idem).
func NewUnaryServerInterceptor(db idem.Beginner, cfg *Config) (grpc.UnaryServerInterceptor, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	s, err := unary.New(db, cfg.unary())
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m := s.Method(info.FullMethod)
		if m == nil {
			return handler(ctx, req)
		}
		var (
			resp any
			herr error
		)
		a := s.Serve(ctx, m, metadata.ValueFromIncomingContext(ctx, MetadataKey), req, func(hctx context.Context) unary.Result {
			resp, herr = handler(hctx, req)
			if herr != nil {
				return unary.Result{Status: status.Convert(herr).Proto()}
			}
			msg, ok := resp.(proto.Message)
			if !ok && resp != nil {
				herr = status.Error(codes.Internal, fmt.Sprintf("idemgrpc: the response of type %T is not a protobuf message", resp))
				return unary.Result{Status: status.Convert(herr).Proto()}
			}
			return unary.Result{Msg: msg}
		})
		if a.Handler {
			return resp, herr
		}
		if a.Replayed {
			_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataReplayed, "true"))
		}
		if a.Status != nil {
			return nil, status.FromProto(a.Status).Err()
		}
		return a.Msg, nil
	}, nil
}
