package main

import "testing"

func TestClean(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"plain text", "plain text"},
		{"déjà vu, 東京, 🙂", "déjà vu, 東京, 🙂"},
		{`a\b "q"`, `a\b "q"`},
		{"\x1b[2J\x1b[H", `\x1b[2J\x1b[H`},
		{"\x1b]0;owned\a", `\x1b]0;owned\a`},
		{"line\nnext\r\tend", `line\nnext\r\tend`},
		{"\x9b31m", `\x9b31m`}, // an invalid byte: the 8-bit CSI of some terminals
		{"\u009b31m", `\u009b31m`},
		{"abc\u202edcba", `abc\u202edcba`},
		{"nul\x00", `nul\x00`},
		{"\ufffd is kept", "\ufffd is kept"},
	}
	for _, c := range cases {
		if got := clean(c.in); got != c.want {
			t.Errorf("clean(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
