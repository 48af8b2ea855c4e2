package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/idemhq/idem/internal/canonjson"
)

// HashBytes returns the hex SHA-256 of b: the request hash for a raw body.
func HashBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// HashJSON returns the hex SHA-256 of v's canonical JSON: v is encoded with
// json.Marshal and the result canonicalized as by CanonicalJSON, so two values
// that encode to equal JSON documents hash equally whatever their field or
// map key order. A value that cannot be encoded, or whose encoding
// CanonicalJSON refuses (two map keys equal under case folding, such as "id"
// and "ID"; nesting deeper than CanonicalJSON allows), is an error, and so is
// a string in v (a field, a map key, an element, a TextMarshaler's text)
// that is not valid UTF-8: json.Marshal would write U+FFFD in its place, so
// that two requests that differ only there would share a hash, and a
// request stored for an Operation would be resumed with U+FFFD instead of
// the client's bytes.
//
// Because v goes through json.Marshal first, the fingerprint is that of v's
// encoding, not of v itself: a float64 is written as its shortest
// round-tripping decimal, and what the json tags leave out is left out.
// Hash the request body with HashJSONBytes when those bytes are what must
// match.
func HashJSON(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("idem: hash request: %w", err)
	}
	// After json.Marshal, which refuses cyclic values.
	if err := canonjson.CheckUTF8(v); err != nil {
		return "", fmt.Errorf("idem: hash request: %w", err)
	}
	canon, err := CanonicalJSON(raw)
	if err != nil {
		return "", err
	}
	return HashBytes(canon), nil
}

// HashJSONBytes returns the hex SHA-256 of the canonical form of the JSON
// document doc (see CanonicalJSON), or CanonicalJSON's error. Use it for
// request bodies: {"a":1,"b":2} and { "b": 2, "a": 1.0 } hash equally.
func HashJSONBytes(doc []byte) (string, error) {
	canon, err := CanonicalJSON(doc)
	if err != nil {
		return "", err
	}
	return HashBytes(canon), nil
}

// CanonicalJSON returns the canonical form of the JSON document doc: two
// documents get the same canonical form exactly when they hold the same
// value, where numbers are exact decimals, strings are sequences of Unicode
// code points and objects are unordered sets of members.
//
// doc must be exactly one JSON value (RFC 8259), with only white space around
// it. CanonicalJSON also refuses, with an error that names the problem and
// its byte offset:
//
//   - two keys in one object that are equal under simple Unicode case
//     folding (as bytes.EqualFold compares: "amount" and "Amount"; "k", "K"
//     and the Kelvin sign U+212A), exact duplicates included. encoding/json
//     matches keys to struct fields that way, last one winning, so such a
//     document has no single meaning a fingerprint could stand for;
//   - invalid UTF-8 and lone UTF-16 surrogate escapes ("\ud800" alone,
//     "\udc00"), which decoders silently turn into U+FFFD;
//   - nesting deeper than 512 arrays and objects;
//   - a nonzero number whose magnitude is 10^1000001 or more, or below
//     10^-1000000 (its decimal exponent in scientific notation beyond
//     ±1000000), so that a short document cannot stand for a huge value.
//
// The canonical form has no insignificant white space, object members sorted
// by the UTF-8 bytes of their unescaped keys, and one spelling per value.
// Strings are escaped as json.Marshal escapes them: \" \\ \b \f \n \r \t,
// the other control characters and < > & as \u00XX (lower-case hex), U+2028
// and U+2029 as \u2028 and \u2029, everything else ('/' and U+007F
// included) as UTF-8. Numbers are compared as exact decimals, never through
// float64, so 1e15, 1000000000000000.0 and 10e14 are one value while 0.3 and
// 0.30000000000000001 are two, and spelled thus:
//
//   - zero is 0, whatever its sign, fraction or exponent;
//   - an integer that ends in at most 20 zeros is written in plain digits
//     (1e2 as 100), so every integer below 10^21 is, and such an integer
//     already written that way (100, -5, 123456789012345678901234567890) is
//     its own canonical form. Other integers are written in scientific
//     notation: 1e+21, 1.5e+300;
//   - any other number is written as a plain decimal without trailing zeros
//     if its magnitude is at least 0.0001 and below 1000000 (2.5, 0.1,
//     0.0001, 123456.5), and in scientific notation otherwise
//     (1.2345675e+06, 1e-05);
//   - a negative number is its magnitude's spelling after '-'.
//
// Scientific notation is the first significant digit, then '.' and the other
// significant digits if there are any, then 'e', the exponent's sign ('+' or
// '-') and its value in at least two digits.
//
// The thresholds and the exponent form are those of
// strconv.FormatFloat(x, 'g', -1, 64), which CanonicalJSON used when it read
// numbers as float64, so that fingerprints taken then still match: every
// number with at most 15 significant digits within float64's normal range
// keeps the spelling it had, save integers of 10^15 and more, which that rule
// spelled two ways (1000000000000000 as written, 1e15 as 1e+15) and which
// now follow the integer rule above.
func CanonicalJSON(doc []byte) ([]byte, error) {
	canon, err := canonjson.Canonicalize(doc)
	if err != nil {
		return nil, fmt.Errorf("idem: canonical JSON: %w", err)
	}
	return canon, nil
}
