package unary

import (
	"errors"
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The stored form of a reply: a format byte, a kind byte, and the protobuf
// encoding of a google.protobuf.Any holding the response (kindMessage) or
// of the google.rpc.Status the handler failed with (kindStatus). The Any's
// type URL names the response type, so a replay decodes it without knowing
// the method.
const (
	replyFormat = 1
	kindMessage = 'm'
	kindStatus  = 's'
)

// reply is what a key stores: the handler's response or its refusal. It
// stores itself with MarshalBinary, so idem keeps its bytes as they are.
type reply struct {
	data   []byte        // the stored form
	msg    proto.Message // decoded on replay: the response
	status *spb.Status   // decoded on replay: the refusal
}

func messageReply(msg proto.Message) (reply, error) {
	a, err := anypb.New(msg)
	if err != nil {
		return reply{}, err
	}
	return encodeReply(kindMessage, a)
}

func statusReply(st *spb.Status) (reply, error) {
	return encodeReply(kindStatus, st)
}

func encodeReply(kind byte, m proto.Message) (reply, error) {
	b, err := proto.MarshalOptions{}.MarshalAppend([]byte{replyFormat, kind}, m)
	if err != nil {
		return reply{}, err
	}
	return reply{data: b}, nil
}

// MarshalBinary returns the stored form.
func (r reply) MarshalBinary() ([]byte, error) {
	if len(r.data) == 0 {
		return nil, errors.New("unary: empty reply")
	}
	return r.data, nil
}

// UnmarshalBinary decodes a stored reply. A response whose type is not
// registered in this binary cannot be decoded.
func (r *reply) UnmarshalBinary(b []byte) error {
	if len(b) < 2 || b[0] != replyFormat {
		return errors.New("unary: not a stored reply of a known format")
	}
	switch b[1] {
	case kindMessage:
		a := new(anypb.Any)
		if err := proto.Unmarshal(b[2:], a); err != nil {
			return fmt.Errorf("unary: stored response: %w", err)
		}
		msg, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("unary: stored response of type %s: %w", a.GetTypeUrl(), err)
		}
		*r = reply{data: b, msg: msg}
	case kindStatus:
		st := new(spb.Status)
		if err := proto.Unmarshal(b[2:], st); err != nil {
			return fmt.Errorf("unary: stored status: %w", err)
		}
		*r = reply{data: b, status: st}
	default:
		return fmt.Errorf("unary: stored reply of unknown kind %q", b[1])
	}
	return nil
}
