package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"mime"
	"net/http"
	"strings"

	"github.com/idemhq/idem/idem"
)

// DefaultFingerprint is the fingerprint the middleware uses when
// Config.Fingerprint is not set (and no FingerprintHeaders are given): the
// hex SHA-256 of the method, the escaped path, the raw query and the body.
//
// A JSON body (Content-Type application/json or any +json type) that parses
// as one JSON document is fingerprinted by value (idem.CanonicalJSON): a
// retry whose body holds the same content with its members in another order
// or its numbers spelt otherwise is the same request and replays. Any other
// body, including one that does not parse as JSON or has members equal
// under case folding, is fingerprinted byte for byte. Each part is
// length-prefixed and the two body forms are told apart, so no two
// different requests encode alike.
func DefaultFingerprint(r *http.Request, body []byte) (string, error) {
	return fingerprintWith(nil)(r, body)
}

func fingerprintWith(headers []string) func(*http.Request, []byte) (string, error) {
	return func(r *http.Request, body []byte) (string, error) {
		h := sha256.New()
		h.Write([]byte("idemhttp/v2"))
		writePart(h, []byte(r.Method))
		writePart(h, []byte(r.URL.EscapedPath()))
		writePart(h, []byte(r.URL.RawQuery))
		for _, name := range headers {
			values := r.Header.Values(name)
			writePart(h, []byte(name))
			writeLen(h, len(values))
			for _, v := range values {
				writePart(h, []byte(v))
			}
		}
		if canon, ok := canonicalJSONBody(r.Header.Get("Content-Type"), body); ok {
			writePart(h, []byte("json"))
			writePart(h, canon)
		} else {
			writePart(h, []byte("bytes"))
			writePart(h, body)
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
}

// canonicalJSONBody returns the canonical form of a JSON body, or false for
// any other body.
func canonicalJSONBody(contentType string, body []byte) ([]byte, bool) {
	if len(body) == 0 || !isJSON(contentType) {
		return nil, false
	}
	canon, err := idem.CanonicalJSON(body)
	return canon, err == nil
}

// isJSON reports whether a Content-Type names JSON: application/json or a
// structured syntax suffix +json (RFC 6839), such as application/merge-patch+json.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

func writePart(h hash.Hash, p []byte) {
	writeLen(h, len(p))
	h.Write(p)
}

func writeLen(h hash.Hash, n int) {
	var buf [binary.MaxVarintLen64]byte
	h.Write(buf[:binary.PutUvarint(buf[:], uint64(n))])
}
