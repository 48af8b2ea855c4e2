package kit

import (
	"bytes"
	"testing"

	"github.com/idemhq/idem/idem"
)

func TestChangeJSON(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"amount":2500,"account_id":1,"currency":"USD"}`, `{"account_id":2,"amount":2500,"currency":"USD"}`},
		{`{"b":"x","a":{"z":true,"y":null}}`, `{"a":{"y":0,"z":true},"b":"x"}`},
		{`{"note":"hi"}`, `{"note":"hi-changed"}`},
		{`{"ok":false}`, `{"ok":true}`},
		{`{"price":2.5}`, `{"price":3.5}`},
		{`{"n":9223372036854775807}`, `{"n":9223372036854775806}`},
		{`{"n":1e300}`, `{"n":-1e+300}`}, // too large to gain 1: negated
		{`[[],{"a":[7]}]`, `[[],{"a":[8]}]`},
		{`{}`, `{"idemtest-changed":true}`},
		{`[]`, `["idemtest-changed"]`},
		{`"s"`, `"s-changed"`},
	} {
		got, err := ChangeJSON([]byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("ChangeJSON(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{``, `{`, `1 2`, `amount=5`} {
		if got, err := ChangeJSON([]byte(bad)); err == nil {
			t.Errorf("ChangeJSON(%q) = %s, want an error", bad, got)
		}
	}
}

// FuzzChangeJSON checks that ChangeJSON changes every JSON document it is
// given, by value: the result is JSON and canonically differs from it.
func FuzzChangeJSON(f *testing.F) {
	for _, s := range []string{
		`{"amount":2500,"account_id":1}`, `{"a":{"b":[1,"x",true,null]}}`, `[]`, `{}`,
		`1e400`, `-0`, `9223372036854775807`, `1.0`, `"é"`, `{"a":1,"a":2}`, `[[[[]]]]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		before, err := idem.CanonicalJSON(doc)
		if err != nil {
			return // not one JSON document the way idem reads one
		}
		out, err := ChangeJSON(doc)
		if err != nil {
			t.Fatalf("ChangeJSON(%s): %v", doc, err)
		}
		after, err := idem.CanonicalJSON(out)
		if err != nil {
			t.Fatalf("ChangeJSON(%s) = %s, which is not JSON: %v", doc, out, err)
		}
		if bytes.Equal(before, after) {
			t.Fatalf("ChangeJSON(%s) = %s, the same document", doc, out)
		}
	})
}
