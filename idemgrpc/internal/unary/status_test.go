package unary

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/code"
)

func TestDefaultStore(t *testing.T) {
	stored := map[code.Code]bool{
		code.Code_NOT_FOUND:           true,
		code.Code_ALREADY_EXISTS:      true,
		code.Code_FAILED_PRECONDITION: true,
		code.Code_OUT_OF_RANGE:        true,
	}
	for c := range code.Code_name {
		if got := DefaultStore(c); got != stored[code.Code(c)] {
			t.Errorf("DefaultStore(%v) = %t", code.Code(c), got)
		}
	}
}

func TestRefusalCode(t *testing.T) {
	for c, want := range map[int32]string{
		CodeNotFound:           "rpc_not_found",
		CodeFailedPrecondition: "rpc_failed_precondition",
		CodeCanceled:           "rpc_canceled",
		99:                     "rpc_code_unknown",
	} {
		if got := refusalCode(c); got != want {
			t.Errorf("refusalCode(%d) = %q, want %q", c, got, want)
		}
	}
}
