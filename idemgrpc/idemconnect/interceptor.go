package idemconnect

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemgrpc/internal/unary"
)

// Interceptor is the configured connect.Interceptor: pass it to a handler
// with connect.WithInterceptors. It is safe for concurrent use.
type Interceptor struct {
	s *unary.Server
}

var _ connect.Interceptor = (*Interceptor)(nil)

// NewInterceptor returns the interceptor on db (an *idem.Client, whose
// Config the keys use, or a pool) with cfg. It checks cfg once; an invalid
// setting, an unknown or streaming procedure, a KeyField that is not a
// string field, a nil db (typed nil included) and a cfg without Scope or
// SharedKeys are errors wrapping idem.ErrInvalidOption.
//
// On a covered procedure with a key, the interceptor fingerprints the
// request and runs the handler inside idem.Run: the handler finds the
// transaction with Tx(ctx) and the key with idem.KeyFromContext, and does
// its database writes through the transaction. Its answer decides:
//
//   - a response: the writes commit together with the key and the
//     response; a retry with the same key receives the stored response,
//     with HeaderReplayed set, without running the handler.
//   - an error whose code is stored (Config.StoreCode, DefaultStoreCode):
//     the writes roll back and the key commits with the error's code,
//     message and details, which every retry receives again.
//   - any other error, or a panic: everything rolls back and the key stays
//     free, so a retry runs the handler again. A panic propagates (see
//     connect.WithRecover).
//
// The interceptor answers by itself, always with an ErrorInfo detail whose
// reason is one of the Reason* constants:
//
//	key missing on a Required procedure     invalid_argument     ReasonMissingKey
//	key invalid, repeated, or two keys      invalid_argument     ReasonInvalidKey (+ BadRequest for KeyField)
//	same key, different request             failed_precondition  ReasonKeyMismatch
//	the first call with the key still runs  aborted + RetryInfo  ReasonInProgress
//	connection lost during COMMIT           unavailable + RetryInfo  ReasonOutcomeUnknown
//	database unavailable, nothing stored    unavailable + RetryInfo  ReasonUnavailable
//	no principal (Config.Scope failed)      unauthenticated      ReasonUnauthenticated
//	answer over MaxResponseBytes            internal             ReasonResponseTooLarge
//
// These are the codes idemgrpc answers, for the same reasons (see
// idemgrpc.NewUnaryServerInterceptor).
//
// On a covered procedure without a key (and Required unset), the handler
// runs in a plain transaction, also available through Tx, that commits
// when it returns a response and rolls back when it returns an error.
// Other procedures, streaming procedures and client-side calls pass
// through untouched.
//
// The handler's context carries the call's values, deadline and
// cancellation. Once the handler has started, the client's departure no
// longer matters: its answer is committed (or not) as it decides, and a
// retry receives it. The handler must not keep the transaction after it
// returns, nor commit or roll it back (both return idem.ErrTxOwned).
//
// A replay returns the stored message, decoded into its type through the
// global protobuf registry and sent through the handler's codec (binary or
// JSON), or the stored error. Interceptors listed before this one see a
// replayed response's Any() as a proto.Message of the stored message, not
// as the generated type. Headers and trailers the handler set, on the
// response or on an error, are sent with the first answer only.
//
// List the interceptor after the one that authenticates the call and sets
// its scope: connect.WithInterceptors(auth, idem).
func NewInterceptor(db idem.Beginner, cfg *Config) (*Interceptor, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	s, err := unary.New(db, cfg.unary())
	if err != nil {
		return nil, err
	}
	return &Interceptor{s: s}, nil
}

// WrapUnary makes covered procedures idempotent; see NewInterceptor.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		m := i.s.Method(spec.Procedure)
		if spec.IsClient || m == nil {
			return next(ctx, req)
		}
		var (
			resp connect.AnyResponse
			herr error
		)
		a := i.s.Serve(ctx, m, req.Header().Values(HeaderKey), req.Any(), func(hctx context.Context) unary.Result {
			resp, herr = next(hctx, req)
			if herr != nil {
				return unary.Result{Status: statusOf(herr)}
			}
			var msg proto.Message
			if resp != nil {
				var ok bool
				if msg, ok = resp.Any().(proto.Message); !ok {
					herr = connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: the response of type %T is not a protobuf message", resp.Any()))
					return unary.Result{Status: statusOf(herr)}
				}
			}
			return unary.Result{Msg: msg}
		})
		switch {
		case a.Handler:
			return resp, herr
		case a.Status != nil:
			err := errorOf(a.Status)
			if a.Replayed {
				err.Meta().Set(HeaderReplayed, "true")
			}
			return nil, err
		}
		r := connect.NewResponse(&replayed{a.Msg})
		r.Header().Set(HeaderReplayed, "true")
		return r, nil
	}
}

// WrapStreamingClient returns next: client calls pass through.
func (i *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler returns next: streaming procedures pass through
// untouched, and Tx returns nil in their handlers.
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// replayed carries a stored response through connect.NewResponse, whose
// type parameter must be a message struct: the replay knows the message
// only as a proto.Message. Codecs see a proto.Message whose reflection is
// the stored message's, so it encodes exactly as the message would; an
// interceptor listed before this one sees Any() return this wrapper, not
// the generated type.
type replayed struct{ proto.Message }

// statusOf is the google.rpc.Status of a handler's error. An error that is
// not a *connect.Error is UNKNOWN, as Connect sends it.
func statusOf(err error) *spb.Status {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return &spb.Status{Code: int32(connect.CodeUnknown), Message: err.Error()}
	}
	st := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: typeURLPrefix + d.Type(), Value: d.Bytes()})
	}
	return st
}

const typeURLPrefix = "type.googleapis.com/"

// errorOf is the *connect.Error of a stored or own status.
func errorOf(st *spb.Status) *connect.Error {
	err := connect.NewError(connect.Code(st.GetCode()), errors.New(st.GetMessage()))
	for _, a := range st.GetDetails() {
		d, derr := connect.NewErrorDetail(a) // an Any is taken as it is: it cannot fail
		if derr == nil {
			err.AddDetail(d)
		}
	}
	return err
}
