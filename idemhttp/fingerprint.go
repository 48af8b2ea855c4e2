package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"net/http"
)

// defaultFingerprint returns the fingerprint WithFingerprint describes: the
// hex SHA-256 of the method, escaped path, raw query, the named headers and
// the body. Each part is length-prefixed, so no two different requests
// encode alike by shifting bytes from one part to the next.
func defaultFingerprint(headers []string) func(*http.Request, []byte) (string, error) {
	return func(r *http.Request, body []byte) (string, error) {
		h := sha256.New()
		h.Write([]byte("idemhttp/v1"))
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
		writePart(h, body)
		return hex.EncodeToString(h.Sum(nil)), nil
	}
}

func writePart(h hash.Hash, p []byte) {
	writeLen(h, len(p))
	h.Write(p)
}

func writeLen(h hash.Hash, n int) {
	var buf [binary.MaxVarintLen64]byte
	h.Write(buf[:binary.PutUvarint(buf[:], uint64(n))])
}
