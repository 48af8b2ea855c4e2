package unary

import (
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The reasons in the google.rpc.ErrorInfo detail of every answer the
// interceptors give by themselves. They are stable: clients may branch on
// them.
const (
	ReasonMissingKey       = "IDEMPOTENCY_KEY_MISSING"
	ReasonInvalidKey       = "IDEMPOTENCY_KEY_INVALID"
	ReasonKeyMismatch      = "IDEMPOTENCY_KEY_MISMATCH"
	ReasonInProgress       = "IDEMPOTENCY_KEY_IN_PROGRESS"
	ReasonOutcomeUnknown   = "OUTCOME_UNKNOWN"
	ReasonUnavailable      = "DATABASE_UNAVAILABLE"
	ReasonUnauthenticated  = "NO_PRINCIPAL"
	ReasonInvalidRequest   = "INVALID_REQUEST"
	ReasonResponseTooLarge = "RESPONSE_TOO_LARGE"
	ReasonCallEnded        = "CALL_ENDED"
	ReasonInternal         = "INTERNAL"
)

// Codes are google.rpc.Code values, shared by gRPC and Connect.
const (
	CodeCanceled           = int32(code.Code_CANCELLED)
	CodeUnknown            = int32(code.Code_UNKNOWN)
	CodeInvalidArgument    = int32(code.Code_INVALID_ARGUMENT)
	CodeDeadlineExceeded   = int32(code.Code_DEADLINE_EXCEEDED)
	CodeNotFound           = int32(code.Code_NOT_FOUND)
	CodeAlreadyExists      = int32(code.Code_ALREADY_EXISTS)
	CodeFailedPrecondition = int32(code.Code_FAILED_PRECONDITION)
	CodeAborted            = int32(code.Code_ABORTED)
	CodeOutOfRange         = int32(code.Code_OUT_OF_RANGE)
	CodeInternal           = int32(code.Code_INTERNAL)
	CodeUnavailable        = int32(code.Code_UNAVAILABLE)
	CodeUnauthenticated    = int32(code.Code_UNAUTHENTICATED)
)

// DefaultStore is the storing rule for a handler's error codes when the
// configuration sets none: the codes that report the outcome of an
// operation that ran and that a retry would meet again (NOT_FOUND,
// ALREADY_EXISTS, FAILED_PRECONDITION, OUT_OF_RANGE) are stored and
// replayed; every other code is not.
func DefaultStore(c int32) bool {
	switch c {
	case CodeNotFound, CodeAlreadyExists, CodeFailedPrecondition, CodeOutOfRange:
		return true
	}
	return false
}

// refusalCode is the idem.Refusal code under which a stored status is
// kept: "rpc_" and the code's name in lower case, e.g. "rpc_not_found".
func refusalCode(c int32) string {
	name, ok := code.Code_name[c]
	if !ok {
		return "rpc_code_unknown"
	}
	if c == CodeCanceled {
		name = "CANCELED" // the spelling gRPC and Connect use
	}
	return "rpc_" + strings.ToLower(name)
}

// own builds the status of an answer the interceptor gives by itself: an
// ErrorInfo with reason and domain, a RetryInfo when retry is positive, and
// extra details.
func own(c int32, reason, domain, message string, retry time.Duration, extra ...proto.Message) *spb.Status {
	details := []proto.Message{&errdetails.ErrorInfo{Reason: reason, Domain: domain}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	details = append(details, extra...)
	st := &spb.Status{Code: c, Message: message}
	for _, d := range details {
		a, err := anypb.New(d)
		if err != nil {
			continue // the details above always encode
		}
		st.Details = append(st.Details, a)
	}
	return st
}
