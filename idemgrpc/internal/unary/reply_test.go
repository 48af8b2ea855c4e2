package unary

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"

	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
)

func TestReplyRoundTrip(t *testing.T) {
	resp := &chargev1.ChargeResponse{ChargeId: 7, AccountId: "acct-1", Amount: 2500, Balance: 97500}
	r, err := messageReply(resp)
	if err != nil {
		t.Fatal(err)
	}
	var back reply
	if err := back.UnmarshalBinary(mustBinary(t, r)); err != nil {
		t.Fatal(err)
	}
	if back.status != nil {
		t.Fatal("a response came back as a status")
	}
	if diff := cmp.Diff(proto.Message(resp), back.msg, protocmp.Transform()); diff != "" {
		t.Fatalf("response differs (-want +got):\n%s", diff)
	}

	detail, err := anypb.New(&errdetails.ErrorInfo{Reason: "INSUFFICIENT_FUNDS", Domain: "example", Metadata: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	st := &spb.Status{Code: CodeFailedPrecondition, Message: "insufficient funds", Details: []*anypb.Any{detail}}
	r, err = statusReply(st)
	if err != nil {
		t.Fatal(err)
	}
	back = reply{}
	if err := back.UnmarshalBinary(mustBinary(t, r)); err != nil {
		t.Fatal(err)
	}
	if back.msg != nil {
		t.Fatal("a status came back as a response")
	}
	if diff := cmp.Diff(st, back.status, protocmp.Transform()); diff != "" {
		t.Fatalf("status differs (-want +got):\n%s", diff)
	}
}

func TestReplyRefusesWhatItCannotRead(t *testing.T) {
	unknown, err := proto.Marshal(&anypb.Any{TypeUrl: "type.googleapis.com/no.such.Message", Value: []byte{8, 1}})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"empty":          nil,
		"format":         {2, kindMessage},
		"kind":           {replyFormat, 'x'},
		"truncated":      {replyFormat, kindStatus, 0x0a, 0x05, 'a'},
		"unknown type":   append([]byte{replyFormat, kindMessage}, unknown...),
		"garbage status": {replyFormat, kindStatus, 0xff, 0xff, 0xff},
	} {
		t.Run(name, func(t *testing.T) {
			var r reply
			if err := r.UnmarshalBinary(b); err == nil {
				t.Fatalf("decoded %v", r)
			}
		})
	}
	if _, err := (reply{}).MarshalBinary(); err == nil {
		t.Fatal("an empty reply encoded")
	}
}

// FuzzReplyBinary: a stored reply, whatever its bytes, decodes or fails
// without panicking, and what decodes re-encodes to a reply that decodes
// to the same thing.
func FuzzReplyBinary(f *testing.F) {
	resp, _ := messageReply(&chargev1.ChargeResponse{ChargeId: 1, AccountId: "a"})
	st, _ := statusReply(&spb.Status{Code: CodeNotFound, Message: "no"})
	f.Add(resp.data)
	f.Add(st.data)
	f.Add([]byte{replyFormat, kindStatus})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r reply
		if err := r.UnmarshalBinary(b); err != nil {
			return
		}
		var again reply
		var err error
		if r.msg != nil {
			again, err = messageReply(r.msg)
		} else {
			again, err = statusReply(r.status)
		}
		if err != nil {
			t.Fatal(err)
		}
		var back reply
		if err := back.UnmarshalBinary(again.data); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(back.msg, r.msg) || !proto.Equal(back.status, r.status) {
			t.Fatal("a decoded reply does not survive a round trip")
		}
	})
}

func mustBinary(t *testing.T, r reply) []byte {
	t.Helper()
	b, err := r.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
