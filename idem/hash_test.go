package idem_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idemhq/idem/idem"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`{"b":2,"a":1}`, `{"a":1,"b":2}`},
		{` { "a" : [ 1 , 2.50, 1e2, -0, 1.0 ] } `, `{"a":[1,2.5,100,0,1]}`},
		{`"\u0041\/"`, `"A/"`},
		{`{"z":{"y":null,"x":true}}`, `{"z":{"x":true,"y":null}}`},
		{`123456789012345678901234567890`, `123456789012345678901234567890`},
		{`0.1`, `0.1`},
		{`[]`, `[]`},
		// Refused while numbers went through float64 (it overflows); numbers
		// are exact decimals now, and 10^999 is as exact as any.
		{`1e999`, `1e+999`},
	}
	for _, c := range cases {
		got, err := idem.CanonicalJSON([]byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1}{}`, `{"a":1,"a":2}`, `[1,]`, `nul`, `1e1000001`, strings.Repeat("[", 600) + strings.Repeat("]", 600)} {
		if _, err := idem.CanonicalJSON([]byte(bad)); err == nil {
			t.Errorf("CanonicalJSON(%.20q) accepted invalid input", bad)
		}
	}
}

// TestCanonicalJSONEqualNumbers pins that every spelling of one value has
// one canonical form, compared as exact decimals: through float64, 1e15 and
// 1000000000000000 were spelled 1e+15 and 1000000000000000.
func TestCanonicalJSONEqualNumbers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		want      string
		spellings []string
	}{
		{"1000000000000000", []string{"1e15", "1000000000000000", "1000000000000000.0", "1E+15", "10e14", "0.1e16", "1.000e15"}},
		{"0", []string{"0", "-0", "0.0", "-0e5", "-0.000E-7", "0e999999999999", "0.0e-99999999999999999999"}},
		{"100", []string{"100", "1e2", "1.00e2", "100.000", "10000e-2", "0.001e5"}},
		{"-5", []string{"-5", "-5.0", "-0.5e1", "-500e-2"}},
		{"2.5", []string{"2.5", "2.50", "25e-1", "0.25e1", "250000000000000000000e-20"}},
		{"0.1", []string{"0.1", "1e-1", "0.10", "10e-2"}},
		{"9007199254740993", []string{"9007199254740993", "9007199254740993.0", "9.007199254740993e15", "90071992547409930e-1"}},
		{"123456789012345678901234567890", []string{"123456789012345678901234567890", "1.2345678901234567890123456789e29", "12345678901234567890123456789e1"}},
		{"-1.2345678901234567890123456789025e+29", []string{"-123456789012345678901234567890.25", "-1.2345678901234567890123456789025e29"}},
		{"100000000000000000000", []string{"1e20", "100000000000000000000", "100000000000000000000.000"}},
		{"1e+21", []string{"1e21", "1000000000000000000000", "1.0e21", "10e20"}},
		{"1.5e+300", []string{"1.5e300", "15e299", "1500e297"}},
		{"1e+999", []string{"1e999", "10e998", "0.1e1000"}},
		{"1e+1000000", []string{"1e1000000", "0.1e1000001", "10e999999"}},
		{"1e-1000000", []string{"1e-1000000", "10e-1000001", "0.1e-999999"}},
		{"1e-400", []string{"1e-400", "0.1e-399"}},
		{"0.0001", []string{"0.0001", "1e-4", "0.00010"}},
		{"1e-05", []string{"0.00001", "1e-5", "1.0E-5"}},
		{"1e-07", []string{"1e-7", "0.0000001", "1.0e-7"}},
		{"123456.5", []string{"123456.5", "1234565e-1"}},
		{"1.2345675e+06", []string{"1234567.5", "1.2345675e6", "12345675e-1"}},
		{"0.30000000000000001", []string{"0.30000000000000001", "30000000000000001e-17"}},
	} {
		t.Run(tc.want, func(t *testing.T) {
			for _, s := range tc.spellings {
				got, err := idem.CanonicalJSON([]byte(s))
				if err != nil || string(got) != tc.want {
					t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", s, got, err, tc.want)
				}
			}
		})
	}
}

// TestCanonicalJSONDistinctNumbers pins that values differing anywhere,
// beyond float64's precision or range included, keep different canonical
// forms and so different fingerprints.
func TestCanonicalJSONDistinctNumbers(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]string{
		{"0.30000000000000001", "0.3"},
		{"9007199254740993.0", "9007199254740992.0"},
		{"9007199254740993", "9007199254740992"},
		{"9.007199254740993e15", "9.007199254740992e15"},
		{"1000000000000001e0", "1e15"},
		{"18446744073709551617.5", "18446744073709551616.5"},
		{"1e-400", "0"},
		{"-1e-400", "1e-400"},
		{"1e400", "1e401"},
		{"1.0000000000000000000000001", "1"},
		{"-0.1", "0.1"},
		{`{"amount":9007199254740993.00,"currency":"USD"}`, `{"amount":9007199254740992.00,"currency":"USD"}`},
		{`[100000000000000000001.0]`, `[1e20]`},
	} {
		a, errA := idem.HashJSONBytes([]byte(pair[0]))
		b, errB := idem.HashJSONBytes([]byte(pair[1]))
		if errA != nil || errB != nil || a == b {
			t.Errorf("HashJSONBytes(%s) = %.12s, %v; HashJSONBytes(%s) = %.12s, %v; want two different hashes",
				pair[0], a, errA, pair[1], b, errB)
		}
	}
}

// TestCanonicalJSONFoldedDuplicateKeys pins that keys equal under simple case
// folding are duplicates. encoding/json matches object keys to struct fields
// that way, the last match winning, so the two orders of such members decode
// to different requests and must not share a fingerprint.
func TestCanonicalJSONFoldedDuplicateKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, wantErr string
	}{
		{"ASCII case", `{"amount":100000,"Amount":1}`, `duplicate object key "Amount" at byte 17: equal under case folding to "amount" at byte 1`},
		{"ASCII case, other order", `{"Amount":1,"amount":100000}`, `duplicate object key "amount" at byte 12: equal under case folding to "Amount" at byte 1`},
		{"exact", `{"a":1,"a":2}`, `duplicate object key "a" at byte 7 (first at byte 1)`},
		{"exact through an escape", `{"a":1,"\u0061":2}`, `duplicate object key "a" at byte 7 (first at byte 1)`},
		{"Kelvin sign", `{"k":1,"` + "\u212a" + `":2}`, "duplicate object key \"\u212a\" at byte 7: equal under case folding to \"k\" at byte 1"},
		{"Kelvin sign escaped", `{"\u212a":1,"K":2}`, "duplicate object key \"K\" at byte 12: equal under case folding to \"\u212a\" at byte 1"},
		{"long s", `{"S":1,"` + "\u017f" + `":2}`, `duplicate object key "ſ" at byte 7: equal under case folding to "S" at byte 1`},
		{"long s in a word", `{"pass":1,"PAſS":2}`, `duplicate object key "PAſS" at byte 10: equal under case folding to "pass" at byte 1`},
		{"title case", `{"ǅ":1,"ǆ":2}`, `duplicate object key "ǆ" at byte 8: equal under case folding to "ǅ" at byte 1`},
		{"sharp s", `{"ß":1,"ẞ":2}`, `duplicate object key "ẞ" at byte 8: equal under case folding to "ß" at byte 1`},
		{"Greek sigma", `{"σ":1,"ς":2,"Σ":3}`, `duplicate object key "ς" at byte 8: equal under case folding to "σ" at byte 1`},
		{"nested", `[{"a":{"ID":1,"x":{},"id":2}}]`, `duplicate object key "id" at byte 21: equal under case folding to "ID" at byte 7`},
		{"after a nested object", `{"id":{"id":1},"Id":2}`, `duplicate object key "Id" at byte 15: equal under case folding to "id" at byte 1`},
		// Large objects are checked by sorting: still the first duplicate
		// in input order is named, not the first in sorted order.
		{"many members", manyKeys(20, map[int]string{12: "K03", 15: "k01"}), `duplicate object key "K03" at byte 97: equal under case folding to "k03" at byte 25`},
		{"long keys shortened", `{"x` + strings.Repeat("é", 40) + `":1,"X` + strings.Repeat("É", 40) + `":2}`,
			`duplicate object key "X` + strings.Repeat("É", 31) + `"… at byte 87: equal under case folding to "x` + strings.Repeat("é", 31) + `"… at byte 1`},
		{"many members, exact", manyKeys(20, map[int]string{18: "k19"}), `duplicate object key "k19" at byte 153 (first at byte 145)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idem.CanonicalJSON([]byte(tc.in))
			if err == nil {
				t.Fatalf("CanonicalJSON(%s) = %s, want an error", tc.in, got)
			}
			if want := "idem: canonical JSON: " + tc.wantErr; err.Error() != want {
				t.Fatalf("CanonicalJSON(%s) error\n got %v\nwant %s", tc.in, err, want)
			}
		})
	}

	// Keys that differ under simple folding are not duplicates, even where
	// full case folding would equate them (ß and SS), nor are equal keys of
	// different objects.
	for _, in := range []string{`{"ß":1,"SS":2}`, `{"ß":1,"ss":2}`, `{"a":1,"b":2}`, `{"ǈ":1,"ǅ":2}`, `{"k":{"K":1}}`, `[{"k":1},{"K":1}]`} {
		if _, err := idem.CanonicalJSON([]byte(in)); err != nil {
			t.Errorf("CanonicalJSON(%s): %v", in, err)
		}
	}

	// Why: encoding/json reads the two orders as two different amounts.
	var first, second struct{ Amount int }
	if err := errors.Join(
		json.Unmarshal([]byte(`{"amount":100000,"Amount":1}`), &first),
		json.Unmarshal([]byte(`{"Amount":1,"amount":100000}`), &second),
	); err != nil || first.Amount == second.Amount {
		t.Fatalf("encoding/json read amounts %d and %d (%v); the test's premise is wrong", first.Amount, second.Amount, err)
	}
	if _, err := idem.HashJSON(map[string]int{"id": 1, "ID": 2}); err == nil {
		t.Error(`HashJSON(map{"id","ID"}) accepted keys equal under case folding`)
	}
}

// manyKeys returns an object of n members "k00":0, "k01":0 and so on, with
// the keys at the indexes of replace replaced. Member i begins at byte 1+8i.
func manyKeys(n int, replace map[int]string) string {
	members := make([]string, n)
	for i := range members {
		k, ok := replace[i]
		if !ok {
			k = fmt.Sprintf("k%02d", i)
		}
		members[i] = fmt.Sprintf("%q:0", k)
	}
	return "{" + strings.Join(members, ",") + "}"
}

// TestCanonicalJSONInvalidText pins that invalid UTF-8 and lone surrogate
// escapes are refused: decoders turn both into U+FFFD, so they would hash
// like a real U+FFFD.
func TestCanonicalJSONInvalidText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, wantErr string
	}{
		{"invalid byte", "\"a\xffb\"", "invalid UTF-8 in string at byte 2"},
		{"invalid byte in a key", "{\"\xfe\":1}", "invalid UTF-8 in string at byte 2"},
		{"truncated sequence", "[\"\xe2\x82\"]", "invalid UTF-8 in string at byte 2"},
		{"overlong encoding", "\"\xc0\xaf\"", "invalid UTF-8 in string at byte 1"},
		{"surrogate encoded in UTF-8", "\"\xed\xa0\x80\"", "invalid UTF-8 in string at byte 1"},
		{"beyond U+10FFFF", "\"\xf4\x90\x80\x80\"", "invalid UTF-8 in string at byte 1"},
		{"high surrogate alone", `"\ud800"`, `lone surrogate \ud800 (a high surrogate not followed by a low one) at byte 1`},
		{"low surrogate alone", `"\udc00"`, `lone surrogate \udc00 (a low surrogate without a high one) at byte 1`},
		{"high then a letter", `"x\uD83Dy"`, `lone surrogate \ud83d (a high surrogate not followed by a low one) at byte 2`},
		{"high then a non-surrogate escape", `"\ud800\u0041"`, `lone surrogate \ud800 (a high surrogate not followed by a low one) at byte 1`},
		{"two highs", `"\ud800\ud800"`, `lone surrogate \ud800 (a high surrogate not followed by a low one) at byte 1`},
		{"pair reversed", `"\udc00\ud800"`, `lone surrogate \udc00 (a low surrogate without a high one) at byte 1`},
		{"high then an escaped newline", `"\udbff\n"`, `lone surrogate \udbff (a high surrogate not followed by a low one) at byte 1`},
		{"high at the end of a key", `{"\ud800":1}`, `lone surrogate \ud800 (a high surrogate not followed by a low one) at byte 2`},
		{"high then a truncated escape", `"\ud800\udc0"`, `lone surrogate \ud800 (a high surrogate not followed by a low one) at byte 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idem.CanonicalJSON([]byte(tc.in))
			if err == nil {
				t.Fatalf("CanonicalJSON(%q) = %q, want an error", tc.in, got)
			}
			if want := "idem: canonical JSON: " + tc.wantErr; err.Error() != want {
				t.Fatalf("CanonicalJSON(%q) error\n got %v\nwant %s", tc.in, err, want)
			}
		})
	}
	for _, tc := range []struct{ in, want string }{
		{`"\ud83d\udcb3"`, `"💳"`},
		{`"\uD83D\uDCB3"`, `"💳"`},
		{`"\udbff\udfff"`, "\"\U0010ffff\""},
		{`"\ufffd"`, "\"\ufffd\""},
		{"\"\ufffd\"", "\"\ufffd\""},
		{`"\u0000"`, `"\u0000"`},
	} {
		got, err := idem.CanonicalJSON([]byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("CanonicalJSON(%s) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestCanonicalJSONGrammar pins that CanonicalJSON accepts exactly one RFC
// 8259 value: each refused document here is one json.Valid refuses too.
func TestCanonicalJSONGrammar(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, wantErr string
	}{
		{"empty", ``, "unexpected end of input, want a value at byte 0"},
		{"only space", " \t\r\n", "unexpected end of input, want a value at byte 4"},
		{"leading zero", `01`, "number with a leading zero at byte 0"},
		{"negative leading zero", `[-012]`, "number with a leading zero at byte 1"},
		{"plus sign", `+1`, "unexpected '+', want a value at byte 0"},
		{"bare minus", `-`, "invalid number, want a digit after '-' at byte 0"},
		{"minus letter", `-x`, "invalid number, want a digit after '-' at byte 0"},
		{"no fraction digits", `1.`, "invalid number, want a digit after '.' at byte 0"},
		{"no integer digits", `.5`, "unexpected '.', want a value at byte 0"},
		{"no exponent digits", `1e`, "invalid number, want a digit in the exponent at byte 0"},
		{"signed empty exponent", `1E+`, "invalid number, want a digit in the exponent at byte 0"},
		{"hex", `0x10`, "unexpected 'x' after the value at byte 1"},
		{"NaN", `NaN`, "unexpected 'N', want a value at byte 0"},
		{"Infinity", `-Infinity`, "invalid number, want a digit after '-' at byte 0"},
		{"trailing comma in array", `[1,]`, "unexpected ']', want a value at byte 3"},
		{"trailing comma in object", `{"a":1,}`, "unexpected '}' in object, want a string key at byte 7"},
		{"leading comma", `[,1]`, "unexpected ',', want a value at byte 1"},
		{"missing comma", `[1 2]`, "unexpected '2' in array, want ',' or ']' at byte 3"},
		{"missing comma in object", `{"a":1 "b":2}`, `unexpected '"' in object, want ',' or '}' at byte 7`},
		{"missing colon", `{"a" 1}`, "unexpected '1' after object key, want ':' at byte 5"},
		{"unquoted key", `{a:1}`, "unexpected 'a' in object, want a string key at byte 1"},
		{"single quotes", `'a'`, `unexpected '\'', want a value at byte 0`},
		{"unterminated string", `"abc`, "unterminated string at byte 0"},
		{"unterminated array", `[1`, "unexpected end of input in array at byte 2"},
		{"unterminated object", `{"a":1`, "unexpected end of input in object at byte 6"},
		{"unterminated member", `{"a":`, "unexpected end of input, want a value at byte 5"},
		{"unknown escape", `"\x"`, "invalid escape sequence: backslash followed by 'x' at byte 1"},
		{"short unicode escape", `"\u12"`, `invalid \u escape, want four hex digits at byte 1`},
		{"escape at the end", `"\`, "unterminated escape sequence at byte 1"},
		{"raw control character", "\"a\tb\"", "control character U+0009 in string (must be escaped) at byte 2"},
		{"raw NUL", "\"\x00\"", "control character U+0000 in string (must be escaped) at byte 1"},
		{"bad literal", `tru`, "invalid literal, want true at byte 0"},
		{"capitalized literal", `True`, "unexpected 'T', want a value at byte 0"},
		{"literal with a tail", `nulls`, "unexpected 's' after the value at byte 4"},
		{"two values", `1 2`, "unexpected '2' after the value at byte 2"},
		{"stray closing brace", `1}`, "unexpected '}' after the value at byte 1"},
		{"trailing garbage", `{} x`, "unexpected 'x' after the value at byte 3"},
		{"byte order mark", "\xef\xbb\xbf{}", "unexpected byte 0xef, want a value at byte 0"},
		{"form feed is not white space", "\f1", "unexpected byte 0x0c, want a value at byte 0"},
		{"NUL after the value", "1\x00", "unexpected byte 0x00 after the value at byte 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if json.Valid([]byte(tc.in)) {
				t.Fatalf("json.Valid(%q) = true; this table is for invalid JSON", tc.in)
			}
			got, err := idem.CanonicalJSON([]byte(tc.in))
			if err == nil {
				t.Fatalf("CanonicalJSON(%q) = %q, want an error", tc.in, got)
			}
			if want := "idem: canonical JSON: " + tc.wantErr; err.Error() != want {
				t.Fatalf("CanonicalJSON(%q) error\n got %v\nwant %s", tc.in, err, want)
			}
		})
	}
}

// TestCanonicalJSONNumberRange pins the one bound on numbers: valid JSON,
// but a value too large or too small for its canonical form to be written.
func TestCanonicalJSONNumberRange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, wantErr string
	}{
		{"large", `1e1000001`, "number out of range (decimal exponent beyond ±1000000) at byte 0"},
		{"large in digits", `{"n":0.1e1000002}`, "number out of range (decimal exponent beyond ±1000000) at byte 5"},
		{"small", `[0.01e-999999]`, "number out of range (decimal exponent beyond ±1000000) at byte 1"},
		{"huge exponent", `-1e999999999999999999999`, "number out of range (decimal exponent beyond ±1000000) at byte 0"},
		{"huge negative exponent", `1e-999999999999999999999`, "number out of range (decimal exponent beyond ±1000000) at byte 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idem.CanonicalJSON([]byte(tc.in))
			if err == nil {
				t.Fatalf("CanonicalJSON(%s) = %s, want an error", tc.in, got)
			}
			if want := "idem: canonical JSON: " + tc.wantErr; err.Error() != want {
				t.Fatalf("CanonicalJSON(%s) error\n got %v\nwant %s", tc.in, err, want)
			}
		})
	}
	// The bound counts the value, not the spelling: these are in range.
	for _, in := range []string{`1e1000000`, `-9.99e1000000`, `1e-1000000`, `0.001e1000003`, `1000e-1000003`, `0e99999999999999999999`} {
		if _, err := idem.CanonicalJSON([]byte(in)); err != nil {
			t.Errorf("CanonicalJSON(%s): %v", in, err)
		}
	}
}

// TestCanonicalJSONDepth pins the nesting bound where it has always been: a
// value inside 512 arrays or objects is fine, one inside 513 is not.
func TestCanonicalJSONDepth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		doc  string
		ok   bool
	}{
		{"513 arrays", strings.Repeat("[", 513) + strings.Repeat("]", 513), true},
		{"514 arrays", strings.Repeat("[", 514) + strings.Repeat("]", 514), false},
		{"a number in 512 arrays", strings.Repeat("[", 512) + "1" + strings.Repeat("]", 512), true},
		{"a number in 513 arrays", strings.Repeat("[", 513) + "1" + strings.Repeat("]", 513), false},
		{"a number in 512 objects", strings.Repeat(`{"a":`, 512) + "1" + strings.Repeat("}", 512), true},
		{"a number in 513 objects", strings.Repeat(`{"a":`, 513) + "1" + strings.Repeat("}", 513), false},
		{"100000 arrays", strings.Repeat("[", 100000) + strings.Repeat("]", 100000), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idem.CanonicalJSON([]byte(tc.doc))
			if (err == nil) != tc.ok {
				t.Fatalf("CanonicalJSON: %v, want ok=%v", err, tc.ok)
			}
			if _, oldErr := oldCanonicalJSON([]byte(tc.doc)); (oldErr == nil) != tc.ok {
				t.Fatalf("the old CanonicalJSON: %v, want ok=%v: the bound moved", oldErr, tc.ok)
			}
			if !tc.ok && !strings.Contains(err.Error(), "nested deeper than 512 at byte ") {
				t.Fatalf("CanonicalJSON: %v, want the nesting named", err)
			}
		})
	}
}

// TestCanonicalJSONStringsAsMarshal checks Unicode scalar values: a string
// canonicalizes to what json.Marshal writes for it, whether the input spells
// its characters raw or as \u escapes (surrogate pairs beyond the BMP).
// Fingerprints of strings thus stay what they were. It checks the BMP, the
// first plane beyond it (4-byte UTF-8, surrogate pairs) and the last 256
// values; TestCanonicalJSONStringsAsMarshalLong checks every value.
func TestCanonicalJSONStringsAsMarshal(t *testing.T) {
	t.Parallel()
	canonicalJSONStringsAsMarshal(t, func(r rune) bool { return r <= 0x1ffff || r > utf8.MaxRune-256 })
}

// TestCanonicalJSONStringsAsMarshalLong is TestCanonicalJSONStringsAsMarshal
// over every Unicode scalar value.
func TestCanonicalJSONStringsAsMarshalLong(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("every Unicode scalar value: make test-long runs it (IDEM_TEST_LONG=1)")
	}
	t.Parallel()
	canonicalJSONStringsAsMarshal(t, func(rune) bool { return true })
}

// canonicalJSONStringsAsMarshal checks the scalar values that in accepts.
func canonicalJSONStringsAsMarshal(t *testing.T, in func(rune) bool) {
	var raw strings.Builder
	var escaped bytes.Buffer
	escaped.WriteByte('"')
	for r := rune(0); r <= utf8.MaxRune; r++ {
		if r >= 0xd800 && r < 0xe000 || !in(r) {
			continue
		}
		raw.WriteRune(r)
		for _, u := range utf16.Encode([]rune{r}) {
			fmt.Fprintf(&escaped, `\u%04X`, u)
		}
	}
	escaped.WriteByte('"')
	want, err := json.Marshal(raw.String())
	if err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string][]byte{"as json.Marshal wrote it": want, "every character escaped": escaped.Bytes()} {
		got, err := idem.CanonicalJSON(in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			i := 0
			for i < len(got) && i < len(want) && got[i] == want[i] {
				i++
			}
			t.Fatalf("%s: differs from json.Marshal at byte %d: %q vs %q", name, i, got[i:min(i+16, len(got))], want[i:min(i+16, len(want))])
		}
	}
}

// TestCanonicalJSONKeepsFingerprints checks ordinary documents against the
// float64-based implementation this one replaced: their canonical forms, and
// so the request hashes stored before the change, are the same.
func TestCanonicalJSONKeepsFingerprints(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		benchPayment,
		`{"amount":19.99,"currency":"USD","items":[{"sku":"A-1","qty":2,"price":9.995}]}`,
		`{"amount":-0.5,"rate":0.0001,"big":123456.75,"huge":1234567.25,"tiny":1e-9,"far":1.5e300}`,
		`{"n":[0,-0,1.0,1e2,2.50,1e14,999999999999999,123456789012345678901234567890]}`,
		`{"html":"<a href=\"x\">&amp;</a>","sep":"\u2028\u2029","ctl":"\u0001\b\f\n\r\t\u001f\u007f","slash":"\/"}`,
		`{"é":"ünïcödé","💳":"\ud83d\udcb3","Z":1,"y":2,"":null}`,
		`[true,false,null,{},[],"",{"a":{"c":[{"e":1,"d":2}],"b":0}}]`,
	} {
		got, err := idem.CanonicalJSON([]byte(doc))
		want, oldErr := oldCanonicalJSON([]byte(doc))
		if err != nil || oldErr != nil || !bytes.Equal(got, want) {
			t.Errorf("CanonicalJSON(%s)\n got %s (%v)\nwant %s (%v), as before", doc, got, err, want, oldErr)
		}
	}
}

// TestCanonicalJSONMatchesEncodingJSON checks 300 generated documents,
// their members in random order and nested up to 8 deep, against
// encoding/json: decoded and marshaled again, a map's keys come out sorted
// by their UTF-8 bytes and its strings escaped as CanonicalJSON must escape
// them.
func TestCanonicalJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	canonicalJSONMatchesEncodingJSON(t, 300)
}

// TestCanonicalJSONMatchesEncodingJSONLong is
// TestCanonicalJSONMatchesEncodingJSON over 2000 documents (the same 300
// first).
func TestCanonicalJSONMatchesEncodingJSONLong(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("2000 documents: make test-long runs it (IDEM_TEST_LONG=1)")
	}
	t.Parallel()
	canonicalJSONMatchesEncodingJSON(t, 2000)
}

// canonicalJSONMatchesEncodingJSON checks n generated documents.
func canonicalJSONMatchesEncodingJSON(t *testing.T, n int) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"a", "b", "Z", "é", "💳", "a b", "<&>", `\u2028`, `k\n`, `\"q`, "id", "amount", ""}
	var gen func(b *strings.Builder, depth int)
	gen = func(b *strings.Builder, depth int) {
		switch n := rng.IntN(10); {
		case depth < 8 && n < 4:
			b.WriteByte('{')
			for i, k := range rng.Perm(len(keys))[:rng.IntN(6)] {
				if i > 0 {
					b.WriteString(" , ")
				}
				fmt.Fprintf(b, `"%s" : `, keys[k])
				gen(b, depth+1)
			}
			b.WriteByte('}')
		case depth < 8 && n < 6:
			b.WriteByte('[')
			for i := range rng.IntN(4) {
				if i > 0 {
					b.WriteByte(',')
				}
				gen(b, depth+1)
			}
			b.WriteByte(']')
		case n < 8:
			fmt.Fprintf(b, "%d", rng.IntN(2001)-1000)
		default:
			fmt.Fprintf(b, `"%s"`, keys[rng.IntN(len(keys))])
		}
	}
	for range n {
		var b strings.Builder
		gen(&b, 0)
		doc := b.String()
		var v any
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatalf("generated invalid JSON %s: %v", doc, err)
		}
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := idem.CanonicalJSON([]byte(doc))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("CanonicalJSON(%s)\n got %s (%v)\nwant %s", doc, got, err, want)
		}
	}
}

// TestCanonicalJSONLarge checks a 6 MiB body whose objects, nested 500 deep,
// all need reordering around a large string: the output must be right (how
// fast is BenchmarkCanonicalJSON's business).
func TestCanonicalJSONLarge(t *testing.T) {
	t.Parallel()
	doc, want := nestedUnsorted(500, 6<<20)
	got, err := idem.CanonicalJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("CanonicalJSON of the nested document: %d bytes, want %d", len(got), len(want))
	}
}

// nestedUnsorted returns a document of about size bytes whose depth objects
// each hold a nested object before a key that sorts first, and its canonical
// form.
func nestedUnsorted(depth, size int) (doc, canon []byte) {
	payload := `"` + strings.Repeat("x", size) + `"`
	d := strings.Repeat(`{"z":`, depth) + payload + strings.Repeat(`,"a":[1.0, 2]}`, depth)
	c := strings.Repeat(`{"a":[1,2],"z":`, depth) + payload + strings.Repeat("}", depth)
	return []byte(d), []byte(c)
}

func TestHashes(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte("body"))
	if got := idem.HashBytes([]byte("body")); got != hex.EncodeToString(sum[:]) {
		t.Fatalf("HashBytes = %s", got)
	}
	a, err1 := idem.HashJSONBytes([]byte(`{"amount":100,"currency":"USD"}`))
	b, err2 := idem.HashJSONBytes([]byte(`{ "currency": "USD", "amount": 100.0 }`))
	c, err3 := idem.HashJSONBytes([]byte(`{"amount":999999,"currency":"USD"}`))
	if err1 != nil || err2 != nil || err3 != nil || a != b || a == c || len(a) != 64 {
		t.Fatalf("HashJSONBytes: %s %s %s (%v %v %v)", a, b, c, err1, err2, err3)
	}
	type req struct {
		Currency string         `json:"currency"`
		Amount   int            `json:"amount"`
		Meta     map[string]int `json:"meta,omitempty"`
	}
	d, err := idem.HashJSON(req{Currency: "USD", Amount: 100})
	if err != nil || d != a {
		t.Fatalf("HashJSON of the struct = %s, %v; want the document's %s", d, err, a)
	}
	if _, err := idem.HashJSON(make(chan int)); err == nil {
		t.Fatal("HashJSON accepted a channel")
	}
	if _, err := idem.HashJSON("\ufffd"); err != nil {
		t.Fatalf(`HashJSON("\ufffd"): %v`, err)
	}
}

// textOf marshals as its text, as json.Marshal writes a TextMarshaler.
type textOf string

func (t textOf) MarshalText() ([]byte, error) { return []byte(t), nil }

// TestHashJSONRefusesInvalidUTF8: json.Marshal writes invalid UTF-8 as
// U+FFFD, so two requests differing only there would share a hash (and one
// be answered the other's result); HashJSON refuses such a string wherever
// json.Marshal would write it, and only there.
func TestHashJSONRefusesInvalidUTF8(t *testing.T) {
	type inner struct {
		Note string `json:"note"`
	}
	type req struct {
		Name    string            `json:"name"`
		Tags    map[string]string `json:"tags,omitempty"`
		Lines   []any             `json:"lines,omitempty"`
		Inner   *inner            `json:"inner,omitempty"`
		Text    textOf            `json:"text,omitempty"`
		Ignored string            `json:"-"`
		Raw     []byte            `json:"raw,omitempty"`
		hidden  string
	}
	refused := map[string]any{
		"string":          "\xff",
		"field":           req{Name: "a\xffb"},
		"map key":         req{Tags: map[string]string{"\xfe": "x"}},
		"map value":       req{Tags: map[string]string{"k": "\xfe"}},
		"element":         req{Lines: []any{"ok", "\xc3"}},
		"through pointer": req{Inner: &inner{Note: "\xff"}},
		"TextMarshaler":   req{Text: "\xff"},
		"text map key":    map[textOf]int{"\xff": 1},
	}
	for name, v := range refused {
		if _, err := idem.HashJSON(v); err == nil {
			t.Errorf("%s: HashJSON accepted invalid UTF-8", name)
		}
	}
	// Bytes json.Marshal never writes as text, or never writes at all.
	accepted := req{Name: "é", Ignored: "\xff", Raw: []byte{0xff}, hidden: "\xff"}
	if _, err := idem.HashJSON(accepted); err != nil {
		t.Errorf("HashJSON(%+v): %v", accepted, err)
	}
}

// benchPayment is a typical payment request body of about 200 bytes, its keys
// in the order a client wrote them.
const benchPayment = `{"amount":125000,"currency":"EUR","source":{"type":"card","token":"tok_1N3xYz2eZvKYlo2C"},` +
	`"description":"Order #18342 <gift>","metadata":{"order_id":"18342","customer":"c_881"},"capture":true}`

// benchDocument returns a JSON document of at least size bytes: an array of
// payment-like objects with strings, numbers and nested members.
func benchDocument(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"batch":"2024-05-01","payments":[`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"pay_%06d","amount":%d.%02d,"currency":"EUR","captured":%t,`+
			`"customer":{"name":"Zoë Ünal %d","email":"c%d@example.com","tags":["vip","eu"]},"fee":1.5e-2,"seq":%d}`,
			i, 1000+i*37, i%100, i%2 == 0, i, i, i)
	}
	b.WriteString(`],"count":1}`)
	return b.Bytes()
}

// BenchmarkCanonicalJSON compares CanonicalJSON with the float64-based
// implementation it replaced (oldCanonicalJSON), side by side:
//
//	go test -run '^$' -bench CanonicalJSON -benchmem ./idem/
func BenchmarkCanonicalJSON(b *testing.B) {
	nested, _ := nestedUnsorted(500, 6<<20)
	docs := []struct {
		name string
		doc  []byte
		old  bool
	}{
		{"payment", []byte(benchPayment), true},
		{"64KiB", benchDocument(64 << 10), true},
		{"6MiB", benchDocument(6 << 20), true},
		{"6MiB-nested-unsorted", nested, false}, // the old one copies each level: minutes
	}
	impls := []struct {
		name string
		f    func([]byte) ([]byte, error)
	}{{"new", idem.CanonicalJSON}, {"old", oldCanonicalJSON}}
	for _, d := range docs {
		for _, impl := range impls {
			if impl.name == "old" && !d.old {
				continue
			}
			b.Run(d.name+"/"+impl.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(d.doc)))
				for b.Loop() {
					if _, err := impl.f(d.doc); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// oldCanonicalJSON is CanonicalJSON as it was before numbers became exact
// decimals (encoding/json's Decoder, numbers through float64), kept as the
// reference for BenchmarkCanonicalJSON and for the fingerprints
// TestCanonicalJSONKeepsFingerprints and FuzzCanonicalJSON hold stable.
func oldCanonicalJSON(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var buf bytes.Buffer
	buf.Grow(len(doc))
	if err := oldCanonValue(dec, &buf, 0); err != nil {
		return nil, fmt.Errorf("idem: canonical JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("idem: canonical JSON: trailing data after the value")
	}
	return buf.Bytes(), nil
}

func oldCanonValue(dec *json.Decoder, buf *bytes.Buffer, depth int) error {
	if depth > 512 {
		return fmt.Errorf("nested deeper than %d", 512)
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return oldCanonObject(dec, buf, depth)
		case '[':
			buf.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					buf.WriteByte(',')
				}
				if err := oldCanonValue(dec, buf, depth+1); err != nil {
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
		return oldCanonNumber(buf, t)
	case string:
		b, _ := json.Marshal(t)
		buf.Write(b)
	case bool:
		buf.WriteString(strconv.FormatBool(t))
	case nil:
		buf.WriteString("null")
	default:
		return fmt.Errorf("unexpected token %T", tok)
	}
	return nil
}

func oldCanonObject(dec *json.Decoder, buf *bytes.Buffer, depth int) error {
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
		if err := oldCanonValue(dec, &val, depth+1); err != nil {
			return err
		}
		members = append(members, member{key, val.Bytes()})
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	buf.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			buf.WriteByte(',')
		}
		b, _ := json.Marshal(m.key)
		buf.Write(b)
		buf.WriteByte(':')
		buf.Write(m.val)
	}
	buf.WriteByte('}')
	return nil
}

func oldCanonNumber(buf *bytes.Buffer, n json.Number) error {
	s := string(n)
	if oldIsInteger(s) {
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

func oldIsInteger(s string) bool {
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
