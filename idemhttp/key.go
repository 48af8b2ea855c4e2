package idemhttp

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/idemhq/idem/idem"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is the response header set to "true" on a replayed
// response.
const HeaderReplayed = "Idempotent-Replayed"

// ParseKey returns the idempotency key of a request's headers, or "" and a
// nil error when the request has no Idempotency-Key header.
//
// Two forms are accepted. The IETF draft "The Idempotency-Key HTTP Header
// Field" defines the value as a Structured Field string: a quoted string of
// printable ASCII in which \" and \\ are the only escapes, e.g.
// "8e03978e-40d5-43e8-bc93-6894a57f9324". Clients written for Stripe send
// the key bare, without quotes. A value that starts with a double quote is
// parsed as a string; any other value is taken as it is.
//
// The error wraps idem.ErrInvalidKey when the header appears more than once
// or holds a list (a comma outside a quoted string), when a quoted string is
// malformed or followed by anything but white space (parameters included),
// when a bare key holds a double quote, and when the key fails
// idem.ValidateKey: empty, longer than 255 bytes, not valid UTF-8, or
// holding a control character.
func ParseKey(h http.Header) (string, error) {
	values := h.Values(HeaderKey)
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("%w: %d %s header lines", idem.ErrInvalidKey, len(values), HeaderKey)
	}
	v := strings.Trim(values[0], " \t")
	var key string
	if strings.HasPrefix(v, `"`) {
		var err error
		if key, err = parseString(v); err != nil {
			return "", err
		}
	} else {
		// A comma means a list, most likely two header lines joined by a
		// proxy; a quote means a mangled string. Neither is one key.
		if i := strings.IndexAny(v, `,"`); i >= 0 {
			return "", fmt.Errorf("%w: %q at byte %d of a bare key", idem.ErrInvalidKey, v[i], i)
		}
		key = v
	}
	if err := idem.ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// parseString parses v, which starts with a double quote, as an RFC 9651
// sf-string followed by nothing but white space.
func parseString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape at byte %d", idem.ErrInvalidKey, i-1)
			}
			b.WriteByte(v[i])
		case c == '"':
			if rest := strings.Trim(v[i+1:], " \t"); rest != "" {
				// The rest is not echoed: it is client input of any length.
				return "", fmt.Errorf("%w: %d bytes after the quoted key (lists and parameters are not accepted)", idem.ErrInvalidKey, len(rest))
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte %#x at %d is not printable ASCII", idem.ErrInvalidKey, c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: unterminated quoted string", idem.ErrInvalidKey)
}

// KeyHeader returns a Config.Key function that takes the key from the
// request header name as it is sent, without the quoted form ParseKey
// accepts: the delivery id a webhook provider sends with every delivery
// and its redeliveries, such as GitHub's X-GitHub-Delivery. A request
// without the header has no key. The header more than once, or a value
// that idem.ValidateKey refuses, is answered 400 (ProblemInvalidKey).
func KeyHeader(name string) func(r *http.Request, body []byte) (string, error) {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request, _ []byte) (string, error) {
		switch values := r.Header.Values(name); len(values) {
		case 0:
			return "", nil
		case 1:
			return strings.Trim(values[0], " \t"), nil
		default:
			return "", fmt.Errorf("%w: %d %s header lines", idem.ErrInvalidKey, len(values), name)
		}
	}
}
