package idemgrpc_test

import (
	"testing"

	"github.com/idemhq/idem/idemgrpc"
	"github.com/idemhq/idem/idemgrpc/internal/unary"
)

// The constants are spelled out for the documentation; they must be the
// values the interceptor uses.
func TestConstantsMatchTheCore(t *testing.T) {
	for got, want := range map[string]string{
		idemgrpc.ReasonMissingKey:       unary.ReasonMissingKey,
		idemgrpc.ReasonInvalidKey:       unary.ReasonInvalidKey,
		idemgrpc.ReasonKeyMismatch:      unary.ReasonKeyMismatch,
		idemgrpc.ReasonInProgress:       unary.ReasonInProgress,
		idemgrpc.ReasonOutcomeUnknown:   unary.ReasonOutcomeUnknown,
		idemgrpc.ReasonUnavailable:      unary.ReasonUnavailable,
		idemgrpc.ReasonUnauthenticated:  unary.ReasonUnauthenticated,
		idemgrpc.ReasonInvalidRequest:   unary.ReasonInvalidRequest,
		idemgrpc.ReasonResponseTooLarge: unary.ReasonResponseTooLarge,
		idemgrpc.ReasonCallEnded:        unary.ReasonCallEnded,
		idemgrpc.ReasonInternal:         unary.ReasonInternal,
	} {
		if got != want {
			t.Errorf("%s, want %s", got, want)
		}
	}
	if idemgrpc.DefaultMaxResponseBytes != unary.DefaultMaxResponseBytes || idemgrpc.DefaultRetryDelay != unary.DefaultRetryDelay {
		t.Error("defaults differ from the core's")
	}
}
