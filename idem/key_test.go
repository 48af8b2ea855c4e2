package idem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemhq/idem/idem"
)

func TestValidateKey(t *testing.T) {
	t.Parallel()
	cases := []struct {
		key string
		ok  bool
	}{
		{"123e4567-e89b-12d3-a456-426614174000", true},
		{"a", true},
		{strings.Repeat("x", 255), true},
		{strings.Repeat("é", 127), true}, // 254 bytes
		{`quote"and\\backslash'; DROP TABLE x; --`, true},
		{"emoji 💸 and RTL \u05d0", true},
		{"", false},
		{strings.Repeat("x", 256), false},
		{strings.Repeat("é", 128), false}, // 256 bytes
		{"nul\x00", false},
		{"tab\t", false},
		{"cr\r", false},
		{"del\x7f", false},
		{"c1\u0085", false},
		{"bad utf8 \xc3", false},
		{"\xff", false},
		{"surrogate \xed\xa0\x80", false},
	}
	for _, c := range cases {
		err := idem.ValidateKey(c.key)
		if c.ok && err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", c.key, err)
		}
		if !c.ok && !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", c.key, err)
		}
	}
}
