package idemhttp_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", 255)
	tests := []struct {
		name   string
		values []string // nil: no header
		want   string
		ok     bool
	}{
		{name: "absent", values: nil, want: "", ok: true},
		{name: "quoted", values: []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, want: "8e03978e-40d5-43e8-bc93-6894a57f9324", ok: true},
		{name: "bare", values: []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, want: "8e03978e-40d5-43e8-bc93-6894a57f9324", ok: true},
		{name: "escaped quote and backslash", values: []string{`"a\"b\\c"`}, want: `a"b\c`, ok: true},
		{name: "quoted with spaces inside", values: []string{`"a b"`}, want: "a b", ok: true},
		{name: "surrounding white space", values: []string{" \t\"k\"\t "}, want: "k", ok: true},
		{name: "bare with surrounding white space", values: []string{"  k  "}, want: "k", ok: true},
		{name: "bare UTF-8", values: []string{"💳-42"}, want: "💳-42", ok: true},
		{name: "bare with a comma inside quotes is fine", values: []string{`"a,b"`}, want: "a,b", ok: true},
		{name: "255 bytes", values: []string{long}, want: long, ok: true},
		{name: "255 bytes quoted", values: []string{`"` + long + `"`}, want: long, ok: true},

		{name: "two header lines", values: []string{"a", "b"}},
		{name: "two equal header lines", values: []string{"a", "a"}},
		{name: "bare list", values: []string{"a, b"}},
		{name: "quoted list", values: []string{`"a", "b"`}},
		{name: "parameters", values: []string{`"a";v=1`}},
		{name: "empty", values: []string{""}},
		{name: "blank", values: []string{"   "}},
		{name: "empty quoted", values: []string{`""`}},
		{name: "unterminated", values: []string{`"abc`}},
		{name: "bad escape", values: []string{`"a\nb"`}},
		{name: "escape at end", values: []string{`"a\`}},
		{name: "non-ASCII inside quotes", values: []string{`"é"`}},
		{name: "control character inside quotes", values: []string{"\"a\x01b\""}},
		{name: "control character bare", values: []string{"a\x01b"}},
		{name: "quote inside bare", values: []string{`a"b`}},
		{name: "256 bytes", values: []string{long + "k"}},
		{name: "256 bytes quoted", values: []string{`"` + long + `k"`}},
		{name: "invalid UTF-8", values: []string{"a\xffb"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add(idemhttp.HeaderKey, v)
			}
			got, err := idemhttp.ParseKey(h)
			if tt.ok {
				if err != nil || got != tt.want {
					t.Fatalf("ParseKey(%q) = %q, %v; want %q, nil", tt.values, got, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseKey(%q) = %q, nil; want an error", tt.values, got)
			}
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("ParseKey(%q) error %v does not wrap idem.ErrInvalidKey", tt.values, err)
			}
		})
	}
}

// FuzzParseKey checks that ParseKey never panics, that every key it returns
// passes idem.ValidateKey, that every error wraps idem.ErrInvalidKey, and
// that a key it accepts survives quoting: the quoted form parses back to the
// same key. Seeds live in testdata/fuzz/FuzzParseKey.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"k", `"k"`, `"a\"b\\c"`, "a, b", `"a";p=1`, `"`, `\`, `""`, " ",
		"8e03978e-40d5-43e8-bc93-6894a57f9324", "💳", "a\x00b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		h := http.Header{}
		h.Set(idemhttp.HeaderKey, value)
		key, err := idemhttp.ParseKey(h)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("ParseKey(%q): %v does not wrap idem.ErrInvalidKey", value, err)
			}
			return
		}
		if verr := idem.ValidateKey(key); verr != nil {
			t.Fatalf("ParseKey(%q) = %q, which ValidateKey rejects: %v", value, key, verr)
		}
		if !isPrintableASCII(key) {
			return // only printable ASCII can be sent as a quoted string
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		h.Set(idemhttp.HeaderKey, quoted)
		again, err := idemhttp.ParseKey(h)
		if err != nil || again != key {
			t.Fatalf("ParseKey(%q) = %q, %v; want %q (quoted form of %q)", quoted, again, err, key, value)
		}
	})
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
