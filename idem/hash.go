package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// HashBytes returns the hex SHA-256 of b: the request hash for a raw body.
func HashBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// HashJSON returns the hex SHA-256 of v's canonical JSON: v is encoded with
// encoding/json and then canonicalized as by CanonicalJSON, so two values
// that encode to equal JSON documents hash equally whatever their field or
// map key order. A value that cannot be encoded as JSON is an error.
func HashJSON(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("idem: hash request: %w", err)
	}
	canon, err := CanonicalJSON(raw)
	if err != nil {
		return "", err
	}
	return HashBytes(canon), nil
}

// HashJSONBytes returns the hex SHA-256 of the canonical form of the JSON
// document doc (see CanonicalJSON). Use it for request bodies: {"a":1,"b":2}
// and { "b": 2, "a": 1.0 } hash equally.
func HashJSONBytes(doc []byte) (string, error) {
	canon, err := CanonicalJSON(doc)
	if err != nil {
		return "", err
	}
	return HashBytes(canon), nil
}

// CanonicalJSON returns doc in a canonical form: object keys sorted, no
// insignificant white space, strings re-escaped one way, and numbers in one
// spelling (integers in decimal without exponent; other numbers as the
// shortest round-tripping float64, so 1.0 and 1e0 become 1). doc must hold
// exactly one JSON value. Duplicate object keys are an error, because parsers
// disagree on which one wins and a fingerprint must not.
func CanonicalJSON(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var buf bytes.Buffer
	buf.Grow(len(doc))
	if err := canonValue(dec, &buf, 0); err != nil {
		return nil, fmt.Errorf("idem: canonical JSON: %w", err)
	}
	// Only white space may follow the value. Token, not More, must judge it:
	// More reports a stray ']' or '}' as the end of the input.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("idem: canonical JSON: trailing data after the value")
	}
	return buf.Bytes(), nil
}

// maxDepth bounds nesting so hostile bodies cannot exhaust the stack.
const maxDepth = 512

func canonValue(dec *json.Decoder, buf *bytes.Buffer, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return canonObject(dec, buf, depth)
		case '[':
			buf.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					buf.WriteByte(',')
				}
				if err := canonValue(dec, buf, depth+1); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil {
				return err
			}
			buf.WriteByte(']')
			return nil
		}
		return fmt.Errorf("unexpected %v", t)
	case json.Number:
		return canonNumber(buf, t)
	case string:
		writeString(buf, t)
	case bool:
		buf.WriteString(strconv.FormatBool(t))
	case nil:
		buf.WriteString("null")
	default:
		return fmt.Errorf("unexpected token %T", tok)
	}
	return nil
}

func canonObject(dec *json.Decoder, buf *bytes.Buffer, depth int) error {
	type member struct {
		key string
		val []byte
	}
	var members []member
	seen := make(map[string]struct{})
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("object key is %T", tok)
		}
		if _, dup := seen[key]; dup {
			return fmt.Errorf("duplicate object key %q", key)
		}
		seen[key] = struct{}{}
		var val bytes.Buffer
		if err := canonValue(dec, &val, depth+1); err != nil {
			return err
		}
		members = append(members, member{key, val.Bytes()})
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	// Sort by the UTF-8 bytes of the key: simple and total (keys are unique).
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	buf.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			buf.WriteByte(',')
		}
		writeString(buf, m.key)
		buf.WriteByte(':')
		buf.Write(m.val)
	}
	buf.WriteByte('}')
	return nil
}

func canonNumber(buf *bytes.Buffer, n json.Number) error {
	s := string(n)
	if isInteger(s) {
		s = strings.TrimPrefix(s, "+")
		if s == "-0" {
			s = "0"
		}
		buf.WriteString(s)
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return fmt.Errorf("number %q out of range", s)
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		buf.WriteString(strconv.FormatInt(int64(f), 10))
		return nil
	}
	buf.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
	return nil
}

func isInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func writeString(buf *bytes.Buffer, s string) {
	// json.Marshal of a string cannot fail; it escapes one way only.
	b, _ := json.Marshal(s)
	buf.Write(b)
}
