package conformance_test

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
)

// Keys used by the scenarios: request_id values must be UUIDs; metadata
// keys may be any valid key.
const (
	uuid1 = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	uuid2 = "0b5c2a3e-8f0d-4c1e-9a8b-2f3e4d5c6b7a"
)

func chargeOf(account string, amount int64) *chargev1.ChargeRequest {
	return &chargev1.ChargeRequest{AccountId: account, Amount: amount}
}

func withID(id string, req *chargev1.ChargeRequest) *chargev1.ChargeRequest {
	req.RequestId = id
	return req
}

// wantOK checks that r is a response, replayed or not, and returns it.
func wantOK(t *testing.T, r result, replayed bool) *chargev1.ChargeResponse {
	t.Helper()
	if r.code != codeOK || r.resp == nil {
		t.Fatalf("code %d %q, want a response", r.code, r.message)
	}
	if r.replayed != replayed {
		t.Fatalf("replayed %t, want %t", r.replayed, replayed)
	}
	return r.resp
}

// wantOwn checks that r is an answer of the interceptor's own with code
// and the ErrorInfo reason, never marked replayed.
func wantOwn(t *testing.T, r result, code int32, reason string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("code %d %q, want %d", r.code, r.message, code)
	}
	if r.replayed {
		t.Fatal("an answer of the interceptor's own is marked replayed")
	}
	if got := reasonOf(r.details); got != reason {
		t.Fatalf("ErrorInfo reason %q, want %q (message %q)", got, reason, r.message)
	}
	if r.message == "" {
		t.Fatal("no message")
	}
}

func reasonOf(details []proto.Message) string {
	for _, d := range details {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

func retryInfoOf(details []proto.Message) *errdetails.RetryInfo {
	for _, d := range details {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri
		}
	}
	return nil
}

// sameProto fails unless want and got are equal protobuf values.
func sameProto(t *testing.T, want, got any) {
	t.Helper()
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Fatalf("differs (-want +got):\n%s", diff)
	}
}
