package unary

import (
	"crypto/sha256"
	"encoding/hex"

	"google.golang.org/protobuf/proto"
)

// Fingerprint returns the hex SHA-256 of the full method name and the
// request's deterministic protobuf encoding.
//
// The server computes it from the request as it parsed it, so the client's
// language and library do not matter. Deterministic encoding is not
// canonical, though: it is stable for one build of the server (one version
// of google.golang.org/protobuf and of the schema), and may change when
// either changes. Fields unknown to the server are hashed as the bytes the
// client sent.
func Fingerprint(method string, req proto.Message) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	// A version tag, and a separator no method name contains, keep the
	// encoding unambiguous and open to a later change of form.
	h.Write([]byte("idemgrpc/v1\n"))
	h.Write([]byte(method))
	h.Write([]byte{'\n'})
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)), nil
}
