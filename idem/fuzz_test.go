package idem_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/idemhq/idem/idem"
)

// FuzzValidateKey checks that ValidateKey accepts exactly the keys its
// contract describes: 1 to 255 bytes of valid UTF-8 without control
// characters. Every rejection wraps ErrInvalidKey. Seeds live in
// testdata/fuzz/FuzzValidateKey.
func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{
		"a", "order-42", "550e8400-e29b-41d4-a716-446655440000",
		"'; DROP TABLE idempotency_keys; --", `\"'` + "`", "💳🔁", "שלום",
		"\u202eevil", "\ufffd", "\xff", "a\x00b", "tab\there", "\u0085", "\x7f",
		strings.Repeat("k", 255), strings.Repeat("k", 256), strings.Repeat("é", 128),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := idem.ValidateKey(key)
		want := keyProblem(key)
		switch {
		case err == nil && want != "":
			t.Fatalf("ValidateKey(%q) accepted a key that is %s", key, want)
		case err != nil && want == "":
			t.Fatalf("ValidateKey(%q) = %v, want nil", key, err)
		case err != nil && !errors.Is(err, idem.ErrInvalidKey):
			t.Fatalf("ValidateKey(%q) = %v, does not wrap ErrInvalidKey", key, err)
		}
	})
}

// keyProblem restates the key contract independently of ValidateKey: it
// returns what is wrong with key, or "" for a valid key.
func keyProblem(key string) string {
	switch {
	case len(key) == 0:
		return "empty"
	case len(key) > idem.MaxKeyLen:
		return "too long"
	case !utf8.ValidString(key):
		return "invalid UTF-8"
	}
	for _, r := range key {
		if unicode.IsControl(r) {
			return "holding a control character"
		}
	}
	return ""
}

// FuzzCanonicalJSON checks CanonicalJSON against encoding/json: it never
// panics; it accepts what json.Valid accepts except documents with duplicate
// keys, nesting deeper than its bound or numbers beyond float64; its output is
// valid JSON and a fixed point; and reordering the members of any object does
// not change HashJSONBytes. Seeds live in testdata/fuzz/FuzzCanonicalJSON.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":2,"a":1}`, `{ "a" : 1.0 , "b" : [ 1e0 , -0 , 0.5 ] }`, `[]`, `{}`,
		`"\u00e9\ud83d\udcb3<&>"`, `null`, `true`, `1e400`, `{"a":1,"a":2}`,
		`[[[[[[[[[[]]]]]]]]]]`, `1}`, `1]`, `1 2`, ` 7 `, `{"x":{"z":null,"y":[{"q":1,"p":2}]}}`,
		"\"\xff\"", `123456789012345678901234567890`, `-0.0`, `1E+2`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		canon, err := idem.CanonicalJSON(doc)
		if err != nil {
			if json.Valid(doc) {
				if why := jsonRefusalReason(doc); why == "" {
					t.Fatalf("CanonicalJSON(%q) = %v, but json.Valid accepts it and it has no duplicate key, deep nesting or huge number", doc, err)
				}
			}
			return
		}
		if !json.Valid(doc) {
			t.Fatalf("CanonicalJSON(%q) = %q, but json.Valid rejects the input", doc, canon)
		}
		if !json.Valid(canon) {
			t.Fatalf("CanonicalJSON(%q) = %q, not valid JSON", doc, canon)
		}
		again, err := idem.CanonicalJSON(canon)
		if err != nil || !bytes.Equal(again, canon) {
			t.Fatalf("CanonicalJSON is not idempotent: %q -> %q -> %q (%v)", doc, canon, again, err)
		}
		h1, err1 := idem.HashJSONBytes(doc)
		reversed := reverseMembers(t, canon)
		h2, err2 := idem.HashJSONBytes(reversed)
		if err1 != nil || err2 != nil || h1 != h2 || h1 != idem.HashBytes(canon) {
			t.Fatalf("hashes differ: %q -> %s (%v); members reversed %q -> %s (%v)", doc, h1, err1, reversed, h2, err2)
		}
	})
}

// jsonRefusalReason returns why CanonicalJSON may refuse a document that
// json.Valid accepts: a duplicate object key, nesting deeper than 512, or a
// non-integer number outside float64. It returns "" when there is none.
func jsonRefusalReason(doc []byte) string {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   map[string]bool
		atKey  bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return ""
		}
		if err != nil {
			return "" // json.Valid accepted it; the decoder must too
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].atKey {
			top := stack[n-1]
			key := tok.(string)
			if top.keys[key] {
				return "duplicate key"
			}
			top.keys[key] = true
			top.atKey = false
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].atKey = true // the value is read; a key comes next
		}
		if len(stack) > 512 {
			return "too deep"
		}
		switch v := tok.(type) {
		case json.Delim:
			stack = append(stack, &frame{object: v == '{', keys: map[string]bool{}, atKey: v == '{'})
		case json.Number:
			if _, err := strconv.ParseInt(string(v), 10, 64); err != nil && strings.ContainsAny(string(v), ".eE") {
				if fl, err := strconv.ParseFloat(string(v), 64); err != nil || math.IsInf(fl, 0) {
					return "number out of range"
				}
			}
		}
	}
}

// reverseMembers re-encodes a canonical document with the members of every
// object in reverse order.
func reverseMembers(t *testing.T, canon []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(canon))
	dec.UseNumber()
	out, err := reverseValue(dec)
	if err != nil {
		t.Fatalf("re-read canonical %q: %v", canon, err)
	}
	return out
}

func reverseValue(dec *json.Decoder) ([]byte, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case json.Delim:
		var parts [][]byte
		for dec.More() {
			var key []byte
			if v == '{' {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				key, _ = json.Marshal(k)
			}
			val, err := reverseValue(dec)
			if err != nil {
				return nil, err
			}
			if key != nil {
				val = append(append(key, ':'), val...)
			}
			parts = append(parts, val)
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		if v == '{' {
			for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
				parts[i], parts[j] = parts[j], parts[i]
			}
			return append(append([]byte("{"), bytes.Join(parts, []byte(" , "))...), '}'), nil
		}
		return append(append([]byte("["), bytes.Join(parts, []byte(","))...), ']'), nil
	case json.Number:
		return []byte(v), nil
	default:
		return json.Marshal(v)
	}
}

// TestCanonicalJSONForms pins the canonical spelling of documents that differ
// only in form, and the documents CanonicalJSON refuses.
func TestCanonicalJSONForms(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"key order", `{"b":2,"a":1}`, `{"a":1,"b":2}`},
		{"white space", " { \"a\" :\t[ 1 , 2 ]\n} ", `{"a":[1,2]}`},
		{"nested key order", `{"z":{"y":1,"x":2},"a":[{"d":0,"c":0}]}`, `{"a":[{"c":0,"d":0}],"z":{"x":2,"y":1}}`},
		{"integral float", `1.0`, `1`},
		{"exponent", `1e0`, `1`},
		{"negative zero", `-0`, `0`},
		{"negative zero float", `-0.0`, `0`},
		{"fraction", `0.50`, `0.5`},
		{"large float", `1.5e300`, `1.5e+300`},
		{"big integer kept exact", `123456789012345678901234567890`, `123456789012345678901234567890`},
		{"string escapes", `"\u0041\/\t"`, `"A/\t"`},
		{"html characters escaped one way", `"<&>"`, `"\u003c\u0026\u003e"`},
		{"unicode", `"\u00e9💳"`, `"é💳"`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"empty containers", `{"a":{},"b":[]}`, `{"a":{},"b":[]}`},
		{"keys sort by bytes", `{"é":1,"z":2,"Z":3}`, `{"Z":3,"z":2,"é":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idem.CanonicalJSON([]byte(tc.in))
			if err != nil {
				t.Fatalf("CanonicalJSON(%q): %v", tc.in, err)
			}
			if string(got) != tc.want {
				t.Fatalf("CanonicalJSON(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
	for _, tc := range []struct{ name, in string }{
		{"empty", ``},
		{"only space", `   `},
		{"duplicate key", `{"a":1,"a":1}`},
		{"nested duplicate key", `[{"k":{"x":1,"x":2}}]`},
		{"two values", `1 2`},
		{"trailing garbage", `{} x`},
		{"stray closing brace", `1}`},
		{"stray closing bracket", `{"a":1}]`},
		{"unterminated", `{"a":`},
		{"infinite number", `1e400`},
		{"too deep", strings.Repeat("[", 600) + strings.Repeat("]", 600)},
		{"bare word", `nope`},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			if got, err := idem.CanonicalJSON([]byte(tc.in)); err == nil {
				t.Fatalf("CanonicalJSON(%q) = %s, want an error", tc.in, got)
			}
		})
	}
}

// TestHashJSONEquivalence checks that HashJSON of a Go value and
// HashJSONBytes of any spelling of its JSON agree.
func TestHashJSONEquivalence(t *testing.T) {
	type charge struct {
		Account int64             `json:"account"`
		Amount  float64           `json:"amount"`
		Meta    map[string]string `json:"meta"`
	}
	v := charge{Account: 7, Amount: 500, Meta: map[string]string{"b": "2", "a": "1"}}
	want, err := idem.HashJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{
		`{"account":7,"amount":500,"meta":{"a":"1","b":"2"}}`,
		`{"meta":{"b":"2","a":"1"},"amount":5e2,"account":7}`,
		` { "amount" : 500.0 , "account" : 7.0 , "meta" : { "a" : "\u0031" , "b" : "2" } } `,
	} {
		got, err := idem.HashJSONBytes([]byte(doc))
		if err != nil {
			t.Fatalf("HashJSONBytes(%s): %v", doc, err)
		}
		if got != want {
			t.Errorf("HashJSONBytes(%s) = %s, want HashJSON's %s", doc, got, want)
		}
	}
	if other, _ := idem.HashJSONBytes([]byte(`{"account":7,"amount":501,"meta":{"a":"1","b":"2"}}`)); other == want {
		t.Error("a different amount hashed equally")
	}
	if _, err := idem.HashJSON(func() {}); err == nil {
		t.Error("HashJSON of a func: want an error")
	}
	if len(want) != 64 {
		t.Errorf("HashJSON = %q, want 64 hex digits", want)
	}
}
