package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// clean makes s safe to print to a terminal: every rune that is not
// printable (control characters such as ESC, which starts ANSI and OSC
// sequences, and format characters such as the bidirectional overrides)
// is written as its Go escape (\x1b, \n, \u202e), and so is every byte
// that is not valid UTF-8 (\xff). Printable UTF-8, spaces and backslashes
// are kept as they are. What the command prints comes from the database:
// stored refusals and results, names, and the server's own error messages,
// any of which a hostile client or server can choose.
func clean(s string) string {
	if isClean(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == ' ' || strconv.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

func isClean(s string) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || (r != ' ' && !strconv.IsPrint(r)) {
			return false
		}
		i += size
	}
	return true
}

// say prints one line, cleaned: no argument can end the line, move the
// cursor or talk to the terminal.
func say(w io.Writer, format string, args ...any) {
	fmt.Fprintln(w, clean(fmt.Sprintf(format, args...)))
}
