package unary

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
)

func TestFingerprint(t *testing.T) {
	const method = "/idem.example.charge.v1.ChargeService/Charge"
	fp := func(method string, m proto.Message) string {
		t.Helper()
		s, err := Fingerprint(method, m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	req := &chargev1.ChargeRequest{RequestId: "8e03978e-40d5-43e8-bc93-6894a57f9324", AccountId: "acct-1", Amount: 2500}

	// The form is part of the contract: a change would turn every retry in
	// flight during an upgrade into a mismatch.
	if got, want := fp(method, req), "5da0ef0907b04f112a72276aab8a380ffcefec793496fbb7239496b481622ca2"; got != want {
		t.Fatalf("fingerprint %s, want %s", got, want)
	}
	if fp(method, req) != fp(method, proto.Clone(req)) {
		t.Fatal("a copy fingerprints differently")
	}
	if fp(method, req) == fp("/idem.example.charge.v1.ChargeService/Other", req) {
		t.Fatal("the method does not count")
	}
	other := proto.Clone(req).(*chargev1.ChargeRequest)
	other.Amount++
	if fp(method, req) == fp(method, other) {
		t.Fatal("the amount does not count")
	}

	// Maps are encoded in key order, whatever the insertion order.
	a, _ := structpb.NewStruct(map[string]any{"x": 1, "y": "two", "z": true})
	for range 20 {
		b, _ := structpb.NewStruct(map[string]any{"z": true, "y": "two", "x": 1})
		if fp(method, a) != fp(method, b) {
			t.Fatal("map order changes the fingerprint")
		}
	}
}
