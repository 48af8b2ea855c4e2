package unary

import (
	"google.golang.org/protobuf/proto"

	"github.com/idemhq/idem/idem"
)

// keyProblem is why a call's key is refused: what to tell the client, and
// the request field at fault ("" when the key came from metadata).
type keyProblem struct {
	reason  string
	message string
	field   string
}

// key returns the call's idempotency key: the KeyField's value if the
// method has one and the request sets it, else the single metadata value,
// else "" (no key). values are the metadata values of the key's name.
func (m *Method) key(values []string, req proto.Message) (string, *keyProblem) {
	var fromMD string
	switch len(values) {
	case 0:
	case 1:
		fromMD = values[0]
		if err := idem.ValidateKey(fromMD); err != nil {
			return "", &keyProblem{reason: ReasonInvalidKey, message: "the idempotency-key metadata is not a valid key: " +
				"1 to 255 bytes of UTF-8 without control characters"}
		}
	default:
		return "", &keyProblem{reason: ReasonInvalidKey, message: "the call carries more than one idempotency-key value"}
	}
	if m.keyField == "" {
		return fromMD, nil
	}
	r := req.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(m.keyField)
	if fd == nil {
		return fromMD, nil
	}
	v := r.Get(fd).String()
	switch {
	case v == "":
		return fromMD, nil
	case !IsUUID(v):
		return "", &keyProblem{reason: ReasonInvalidKey, field: string(m.keyField),
			message: "the " + string(m.keyField) + " field must be a UUID (8-4-4-4-12 hexadecimal digits, not all zero)"}
	case fromMD != "" && fromMD != v:
		return "", &keyProblem{reason: ReasonInvalidKey, field: string(m.keyField),
			message: "the " + string(m.keyField) + " field and the idempotency-key metadata name different keys"}
	}
	return v, nil
}

// IsUUID reports whether s is a UUID in its canonical textual form, 36
// characters of hexadecimal digits (either case) grouped 8-4-4-4-12, other
// than the nil UUID. Any version is accepted.
func IsUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	zero := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
			continue
		}
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
		default:
			return false
		}
		if c != '0' {
			zero = false
		}
	}
	return !zero
}
