package canonjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/internal/canonjson"
)

// FuzzCanonicalJSON checks Canonicalize against encoding/json and
// math/big:
//
//   - it never panics;
//   - it refuses exactly what json.Valid refuses and what jsonRefusalReason
//     names: keys equal under case folding, invalid UTF-8, lone surrogates,
//     nesting deeper than 512, numbers out of range; each error names a byte
//     offset, and idem.CanonicalJSON returns it behind its prefix;
//   - its output is valid JSON and a fixed point, and reordering the members
//     of any object does not change idem.HashJSONBytes, which is
//     idem.HashBytes of the output;
//   - its output holds the input's value: the same structure, keys and
//     strings, and numbers equal as exact decimals (big.Rat, never float64);
//   - its output is what encoding/json writes for the decoded output, its
//     map keys sorted and its strings escaped the one way;
//   - a document whose numbers are all plain integers keeps the canonical
//     form the float64-based implementation gave it (see floatEraForm), and
//     so its fingerprint.
//
// Seeds live in testdata/fuzz/FuzzCanonicalJSON.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":2,"a":1}`, `{ "a" : 1.0 , "b" : [ 1e0 , -0 , 0.5 ] }`, `[]`, `{}`,
		`"\u00e9\ud83d\udcb3<&>"`, `null`, `true`, `1e400`, `{"a":1,"a":2}`,
		`[[[[[[[[[[]]]]]]]]]]`, `1}`, `1]`, `1 2`, ` 7 `, `{"x":{"z":null,"y":[{"q":1,"p":2}]}}`,
		"\"\xff\"", `123456789012345678901234567890`, `-0.0`, `1E+2`, ``,
		`{"amount":100000,"Amount":1}`, "{\"k\":1,\"\u212a\":2}", `{"s":1,"\u017f":2}`,
		`[1e15,1000000000000000,1000000000000000.0,1E+15,10e14,0.1e16]`,
		`[0.30000000000000001,0.3]`, `[9007199254740993.0,9007199254740992.0]`, `[-0,0,0.0,-0e5]`,
		`1e1000001`, `1e-1000000`, `[1e-7,1234567.5,123456.5,1e21,1e20]`,
		`"\udc00"`, `"\ud800\u0041"`, "\"\xed\xa0\x80\"", `"\u2028\u2029<>&\u0000\u007f\b\f"`,
		`{"z":{"y":1,"x":{"b":[{"d":1,"c":2}],"a":0}},"w":[{"v":1,"u":2}],"a":{"c":{},"b":[]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		canon, err := canonjson.Canonicalize(doc)
		if err != nil {
			if json.Valid(doc) && jsonRefusalReason(doc) == "" {
				t.Fatalf("Canonicalize(%q) = %v, but json.Valid accepts it and jsonRefusalReason finds nothing wrong", doc, err)
			}
			if !strings.Contains(err.Error(), " at byte ") {
				t.Fatalf("Canonicalize(%q) = %v, want a byte offset", doc, err)
			}
			if _, idemErr := idem.CanonicalJSON(doc); idemErr == nil || idemErr.Error() != "idem: canonical JSON: "+err.Error() {
				t.Fatalf("idem.CanonicalJSON(%q) = %v, want Canonicalize's error %v behind the prefix", doc, idemErr, err)
			}
			return
		}
		if !json.Valid(doc) {
			t.Fatalf("Canonicalize(%q) = %q, but json.Valid rejects the input", doc, canon)
		}
		if why := jsonRefusalReason(doc); why != "" {
			t.Fatalf("Canonicalize(%q) = %q, but the input has %s", doc, canon, why)
		}
		if !json.Valid(canon) {
			t.Fatalf("Canonicalize(%q) = %q, not valid JSON", doc, canon)
		}
		again, err := canonjson.Canonicalize(canon)
		if err != nil || !bytes.Equal(again, canon) {
			t.Fatalf("Canonicalize is not idempotent: %q -> %q -> %q (%v)", doc, canon, again, err)
		}
		h1, err1 := idem.HashJSONBytes(doc)
		reversed := reverseMembers(t, canon)
		h2, err2 := idem.HashJSONBytes(reversed)
		if err1 != nil || err2 != nil || h1 != h2 || h1 != idem.HashBytes(canon) {
			t.Fatalf("hashes differ: %q -> %s (%v); members reversed %q -> %s (%v)", doc, h1, err1, reversed, h2, err2)
		}
		in, err1 := decodeUseNumber(doc)
		out, err2 := decodeUseNumber(canon)
		if err1 != nil || err2 != nil {
			t.Fatalf("decode %q: %v; decode its canonical form %q: %v", doc, err1, canon, err2)
		}
		if diff := sameValue(in, out, "$"); diff != "" {
			t.Fatalf("Canonicalize(%q) = %q, a different value: %s", doc, canon, diff)
		}
		// encoding/json marshals a map with its keys sorted by their bytes,
		// strings escaped as the canonical form escapes them, and a
		// json.Number as written: the canonical form is its own re-encoding.
		if again, err := json.Marshal(out); err != nil || !bytes.Equal(again, canon) {
			t.Fatalf("Canonicalize(%q) = %q, but encoding/json re-encodes it as %q (%v)", doc, canon, again, err)
		}
		if plainIntegersOnly(doc) {
			old, err := floatEraForm(in)
			if err != nil || !bytes.Equal(old, canon) {
				t.Fatalf("Canonicalize(%q) = %q, but the old implementation gave %q (%v): the fingerprint moved", doc, canon, old, err)
			}
		}
	})
}

// jsonRefusalReason returns why Canonicalize may refuse a document that
// json.Valid accepts: invalid UTF-8, a lone surrogate escape, two keys of an
// object equal under strings.EqualFold, nesting deeper than 512, or a number
// whose decimal exponent in scientific notation is beyond ±1000000. It
// returns "" when there is none.
func jsonRefusalReason(doc []byte) string {
	if !utf8.Valid(doc) {
		return "invalid UTF-8" // outside strings json.Valid allows only ASCII
	}
	if hasLoneSurrogate(doc) {
		return "a lone surrogate"
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   []string
		atKey  bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
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
			for _, k := range top.keys {
				if strings.EqualFold(k, key) {
					return "duplicate keys (under case folding)"
				}
			}
			top.keys = append(top.keys, key)
			top.atKey = false
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].atKey = true // the value is read; a key comes next
		}
		if len(stack) > 512 {
			return "nesting deeper than 512"
		}
		switch v := tok.(type) {
		case json.Delim:
			stack = append(stack, &frame{object: v == '{', atKey: v == '{'})
		case json.Number:
			if numberOutOfRange(string(v)) {
				return "a number out of range"
			}
		}
	}
}

// hasLoneSurrogate reports whether a string in the valid JSON document doc
// holds a \u escape of a UTF-16 surrogate that is not a high surrogate
// followed at once by an escaped low one. encoding/json cannot tell: it
// decodes lone surrogates as U+FFFD.
func hasLoneSurrogate(doc []byte) bool {
	surrogate := func(b []byte) (rune, bool) {
		if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
			return 0, false
		}
		r, err := strconv.ParseUint(string(b[2:6]), 16, 16)
		return rune(r), err == nil && utf16.IsSurrogate(rune(r))
	}
	inString := false
	for i := 0; i < len(doc); i++ {
		switch {
		case !inString:
			inString = doc[i] == '"'
		case doc[i] == '"':
			inString = false
		case doc[i] == '\\':
			if r, ok := surrogate(doc[i:]); ok {
				if lo, ok := surrogate(doc[i+6:]); r >= 0xdc00 || !ok || lo < 0xdc00 {
					return true
				}
				i += 11 // the pair
				continue
			}
			i++ // the escaped character
		}
	}
	return false
}

// numberOutOfRange reports whether the JSON number s is nonzero with a
// decimal exponent in scientific notation beyond ±1000000, computed with
// big.Int so that no exponent is too long.
func numberOutOfRange(s string) bool {
	mant, exp, _ := strings.Cut(strings.ToLower(strings.TrimPrefix(s, "-")), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	first := strings.IndexFunc(intPart+frac, func(r rune) bool { return r != '0' })
	if first < 0 {
		return false // zero
	}
	e := new(big.Int)
	if exp != "" {
		e.SetString(strings.TrimPrefix(exp, "+"), 10)
	}
	e.Add(e, big.NewInt(int64(len(intPart)-1-first)))
	return e.CmpAbs(big.NewInt(1_000_000)) > 0
}

func decodeUseNumber(doc []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// sameValue compares two values decoded with UseNumber, numbers as exact
// decimals, and describes the first difference ("" if none) at path.
func sameValue(a, b any, path string) string {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return fmt.Sprintf("%s: %v vs %v", path, a, b)
		}
		for k, va := range a {
			vb, ok := b[k]
			if !ok {
				return fmt.Sprintf("%s: key %q is missing", path, k)
			}
			if diff := sameValue(va, vb, path+"."+strconv.Quote(k)); diff != "" {
				return diff
			}
		}
		return ""
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return fmt.Sprintf("%s: %v vs %v", path, a, b)
		}
		for i := range a {
			if diff := sameValue(a[i], b[i], fmt.Sprintf("%s[%d]", path, i)); diff != "" {
				return diff
			}
		}
		return ""
	case json.Number:
		if b, ok := b.(json.Number); !ok || !decimalEqual(string(a), string(b)) {
			return fmt.Sprintf("%s: number %v vs %v", path, a, b)
		}
		return ""
	}
	if a != b { // string, bool or nil
		return fmt.Sprintf("%s: %#v vs %#v", path, a, b)
	}
	return ""
}

// decimalEqual reports whether the JSON numbers a and b are the same exact
// decimal. big.Rat parses each mantissa and big.Int applies the exponents:
// big.Rat.SetString alone refuses exponents beyond 10^6, which Canonicalize
// accepts.
func decimalEqual(a, b string) bool {
	split := func(s string) (*big.Rat, *big.Int, int) {
		mant, exp, _ := strings.Cut(strings.ToLower(s), "e")
		m, ok := new(big.Rat).SetString(mant)
		if !ok {
			panic("not a JSON number: " + s)
		}
		e := new(big.Int)
		if exp != "" {
			e.SetString(strings.TrimPrefix(exp, "+"), 10)
		}
		return m, e, len(mant)
	}
	ma, ea, la := split(a)
	mb, eb, lb := split(b)
	if ma.Sign() == 0 || mb.Sign() == 0 {
		return ma.Sign() == mb.Sign()
	}
	// A nonzero mantissa of n characters lies in [10^-n, 10^n): equal values
	// cannot have exponents further apart than la+lb.
	d := new(big.Int).Sub(ea, eb)
	if d.CmpAbs(big.NewInt(int64(la+lb))) >= 0 {
		return false
	}
	scale := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), new(big.Int).Abs(d), nil))
	if d.Sign() > 0 {
		ma.Mul(ma, scale)
	} else {
		mb.Mul(mb, scale)
	}
	return ma.Cmp(mb) == 0
}

// plainIntegersOnly reports whether every number in the valid JSON document
// doc is an integer in plain digits with at most 20 trailing zeros: the
// numbers whose canonical spelling the exact rule kept from the float64 one.
func plainIntegersOnly(doc []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return errors.Is(err, io.EOF)
		}
		if n, ok := tok.(json.Number); ok {
			s := strings.TrimPrefix(string(n), "-")
			if strings.ContainsAny(s, ".eE") || len(s)-len(strings.TrimRight(s, "0")) > 20 {
				return false
			}
		}
	}
}

// floatEraForm returns the canonical form that the float64-based
// implementation (oldCanonicalJSON in idem's tests) gave a document whose
// numbers are all plain integers, from the document decoded with UseNumber:
// such a number was written as it stood, save -0 as 0, and the rest as
// encoding/json writes it, map keys sorted by their bytes.
func floatEraForm(v any) ([]byte, error) {
	var zeroSigned func(v any) any
	zeroSigned = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			out := make(map[string]any, len(v))
			for k, e := range v {
				out[k] = zeroSigned(e)
			}
			return out
		case []any:
			out := make([]any, len(v))
			for i, e := range v {
				out[i] = zeroSigned(e)
			}
			return out
		case json.Number:
			if v == "-0" {
				return json.Number("0")
			}
		}
		return v
	}
	return json.Marshal(zeroSigned(v))
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
// only in form, and the documents Canonicalize refuses.
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
		// Refused while numbers went through float64, which it overflows:
		// numbers are exact decimals now, and this one is within range.
		{"beyond float64", `1e400`, `1e+400`},
		{"integer from an exponent", `1e15`, `1000000000000000`},
		{"big integer kept exact", `123456789012345678901234567890`, `123456789012345678901234567890`},
		{"string escapes", `"\u0041\/\t"`, `"A/\t"`},
		{"html characters escaped one way", `"<&>"`, `"\u003c\u0026\u003e"`},
		{"unicode", `"\u00e9💳"`, `"é💳"`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"empty containers", `{"a":{},"b":[]}`, `{"a":{},"b":[]}`},
		// Not z and Z: keys equal under case folding are refused.
		{"keys sort by bytes", `{"é":1,"z":2,"Y":3}`, `{"Y":3,"z":2,"é":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := canonjson.Canonicalize([]byte(tc.in))
			if err != nil {
				t.Fatalf("Canonicalize(%q): %v", tc.in, err)
			}
			if string(got) != tc.want {
				t.Fatalf("Canonicalize(%q) = %s, want %s", tc.in, got, tc.want)
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
		{"number out of range", `1e1000001`},
		{"keys equal under case folding", `{"id":1,"ID":2}`},
		{"invalid UTF-8", "\"\xff\""},
		{"lone surrogate", `"\ud800"`},
		{"too deep", strings.Repeat("[", 600) + strings.Repeat("]", 600)},
		{"bare word", `nope`},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			if got, err := canonjson.Canonicalize([]byte(tc.in)); err == nil {
				t.Fatalf("Canonicalize(%q) = %s, want an error", tc.in, got)
			}
		})
	}
}
