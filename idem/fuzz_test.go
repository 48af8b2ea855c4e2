package idem_test

import (
	"errors"
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
