package canonjson_test

import (
	"encoding/json"
	"testing"

	"github.com/idemhq/idem/internal/canonjson"
)

// The edges of the ranges Canonicalize tests bytes and runes against:
// the first and last letters folded for duplicate keys, and the first and
// last low surrogates of an escaped pair (and the first code unit past
// them, which pairs with nothing).
func TestCanonicalJSONRangeEdges(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{`{"a":1,"A":2}`, `{"z":1,"Z":2}`, `{"Ab":1,"aB":2}`, `{"yZ":1,"Yz":2}`} {
		if _, err := canonjson.Canonicalize([]byte(doc)); err == nil {
			t.Errorf("Canonicalize(%s) accepted keys equal under case folding", doc)
		}
	}
	if _, err := canonjson.Canonicalize([]byte(`{"a":1,"b":2,"@":3,"[":4,"` + "`" + `":5,"{":6}`)); err != nil {
		t.Errorf("keys next to the letters in ASCII refused: %v", err)
	}
	for in, want := range map[string]string{
		`"\ud83d\udc00"`: "\U0001F400", // the first low surrogate
		`"\ud83d\udfff"`: "\U0001F7FF", // the last
		`"\ud800\udc00"`: "\U00010000",
		`"\udbff\udfff"`: "\U0010FFFF",
	} {
		out, err := canonjson.Canonicalize([]byte(in))
		var got string
		if err == nil {
			err = json.Unmarshal(out, &got)
		}
		if err != nil || got != want {
			t.Errorf("Canonicalize(%s) = %s (%q), %v; want %q", in, out, got, err, want)
		}
	}
	for _, in := range []string{`"\ud83d\ue000"`, `"\ud83d\udbff"`, `"\ud83d"`, `"\udc00"`} {
		if out, err := canonjson.Canonicalize([]byte(in)); err == nil {
			t.Errorf("Canonicalize(%s) = %s, %v; want the lone surrogate refused", in, out, err)
		}
	}
}

// The spelling of numbers at each edge where it changes form (plain or
// scientific, one or two exponent digits) is pinned: request hashes are
// stored, so a respelling would turn every retry after an upgrade into a
// mismatch.
func TestCanonicalJSONNumberEdges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`1.5e-9`, `1.5e-09`},
		{`1.5e-10`, `1.5e-10`},
		{`1.2345678901e9`, `1.2345678901e+09`},
		{`1.23456789012e10`, `1.23456789012e+10`},
		{`1e20`, `100000000000000000000`},
		{`12345678901234567890e1`, `123456789012345678900`},
		{`1e21`, `1e+21`},
		{`123456.5`, `123456.5`},
		{`1234567.5`, `1.2345675e+06`},
		{`0.0001`, `0.0001`},
		{`0.00012345`, `0.00012345`},
		{`0.00001`, `1e-05`},
		{`-0.0`, `0`},
		{`1.5e99`, `1.5e+99`},
		{`1.5e100`, `1.5e+100`},
		{`2.5e-99`, `2.5e-99`},
		{`2.5e-100`, `2.5e-100`},
	} {
		got, err := canonjson.Canonicalize([]byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("Canonicalize(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}
