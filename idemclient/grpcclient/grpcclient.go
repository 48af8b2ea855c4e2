// Package grpcclient is a gRPC unary client interceptor that sends every
// call with an idempotency key, kept across every attempt, and retries the
// answers that are safe to retry, as an idemclient.Policy says.
//
//	intercept, err := grpcclient.UnaryClientInterceptor(nil) // the default Policy
//	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(intercept), ...)
//
// The key goes in the idempotency-key metadata (MetadataKey), which idem's
// server interceptor (github.com/idemhq/idem/idemgrpc) reads: the key the
// outgoing metadata already carries, else the context's
// (idemclient.ContextWithKey), else a new UUID. It is set once, before
// the first attempt, in the call's context, so it persists both across the
// interceptor's own retries and across those of grpc-go's retry policy
// (a service config's retryPolicy), which re-sends the call below the
// interceptors with the same metadata.
//
// Retried, after the delay of the status's google.rpc.RetryInfo detail when
// it has one and that is longer than the backoff:
//
//	UNAVAILABLE                  the server or the connection is down, or idem's
//	                             database is (nothing stored), or the outcome of a
//	                             commit is unknown: only the same key learns it
//	ABORTED with a RetryInfo     a call with the key is in progress (idemgrpc's
//	                             answer, the counterpart of HTTP's 409)
//
// Every other code is returned at once: FAILED_PRECONDITION (idemgrpc's
// answer to a key reused for another request), INVALID_ARGUMENT, an
// ABORTED without RetryInfo (a conflict the application resolves, not a
// retry), DEADLINE_EXCEEDED and CANCELED (the caller's context).
package grpcclient

import (
	"context"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemhq/idem/idemclient"
)

// MetadataKey is the metadata that carries the idempotency key.
const MetadataKey = "idempotency-key"

// MetadataReplayed is the response header metadata that idemgrpc sets to
// "true" on an answer replayed from the stored result.
const MetadataReplayed = "idempotent-replayed"

// UnaryClientInterceptor returns the interceptor that retries as p says
// (nil: the defaults). An invalid p is an error wrapping
// idemclient.ErrInvalidPolicy. The call's error is the last attempt's.
func UnaryClientInterceptor(p *idemclient.Policy) (grpc.UnaryClientInterceptor, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var res idemclient.Result
		var report *resultOption
		for _, o := range opts {
			if r, ok := o.(*resultOption); ok {
				report = r
			}
		}
		if keys := metadata.ValueFromOutgoingContext(ctx, MetadataKey); len(keys) > 0 {
			res.Key = keys[0]
		} else {
			res.Key = idemclient.KeyFromContext(ctx)
			if res.Key == "" {
				var err error
				if res.Key, err = p.NewKey(); err != nil {
					return err
				}
			}
			ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, res.Key)
		}
		for {
			res.Attempts++
			var header metadata.MD
			err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&header))...)
			res.Replayed = first(header, MetadataReplayed) == "true"
			if report != nil {
				*report.r = res
			}
			hint, retry := Retryable(err)
			if !retry || ctx.Err() != nil {
				return err
			}
			wait, ok := p.Next(ctx, res.Attempts, hint)
			if !ok {
				return err
			}
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return err
			case <-timer.C:
			}
		}
	}, nil
}

// Retryable reports whether a call that ended with err may be made again
// with the same key, and the delay its RetryInfo detail asks for (0 when
// it has none): UNAVAILABLE, and ABORTED with a RetryInfo.
func Retryable(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false
	}
	st := status.Convert(err)
	var delay time.Duration
	info := false
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = true
			delay = max(delay, ri.GetRetryDelay().AsDuration())
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		return delay, true
	case codes.Aborted:
		return delay, info
	}
	return 0, false
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// WithResult returns a call option that makes the interceptor store in *r,
// once the call returns, which key it sent, how many attempts it made and
// whether the last answer was replayed (idemgrpc's idempotent-replayed
// header). Like grpc.Header, it is written when the call returns: read it
// only then.
func WithResult(r *idemclient.Result) grpc.CallOption {
	return &resultOption{r: r}
}

type resultOption struct {
	grpc.EmptyCallOption
	r *idemclient.Result
}
