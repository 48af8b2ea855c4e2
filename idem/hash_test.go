package idem_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

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
	}
	for _, c := range cases {
		got, err := idem.CanonicalJSON([]byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1}{}`, `{"a":1,"a":2}`, `[1,]`, `nul`, `1e999`, strings.Repeat("[", 600) + strings.Repeat("]", 600)} {
		if _, err := idem.CanonicalJSON([]byte(bad)); err == nil {
			t.Errorf("CanonicalJSON(%.20q) accepted invalid input", bad)
		}
	}
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
}
