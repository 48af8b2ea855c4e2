package idemconnect_test

import (
	"testing"

	"github.com/idemhq/idem/idemgrpc/idemconnect"
	"github.com/idemhq/idem/idemgrpc/internal/unary"
)

// The constants are spelled out for the documentation; they must be the
// values the interceptor uses.
func TestConstantsMatchTheCore(t *testing.T) {
	for got, want := range map[string]string{
		idemconnect.ReasonMissingKey:       unary.ReasonMissingKey,
		idemconnect.ReasonInvalidKey:       unary.ReasonInvalidKey,
		idemconnect.ReasonKeyMismatch:      unary.ReasonKeyMismatch,
		idemconnect.ReasonInProgress:       unary.ReasonInProgress,
		idemconnect.ReasonOutcomeUnknown:   unary.ReasonOutcomeUnknown,
		idemconnect.ReasonUnavailable:      unary.ReasonUnavailable,
		idemconnect.ReasonUnauthenticated:  unary.ReasonUnauthenticated,
		idemconnect.ReasonInvalidRequest:   unary.ReasonInvalidRequest,
		idemconnect.ReasonResponseTooLarge: unary.ReasonResponseTooLarge,
		idemconnect.ReasonCallEnded:        unary.ReasonCallEnded,
		idemconnect.ReasonInternal:         unary.ReasonInternal,
	} {
		if got != want {
			t.Errorf("%s, want %s", got, want)
		}
	}
	if idemconnect.DefaultMaxResponseBytes != unary.DefaultMaxResponseBytes || idemconnect.DefaultRetryDelay != unary.DefaultRetryDelay {
		t.Error("defaults differ from the core's")
	}
}
