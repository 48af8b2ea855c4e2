package idem

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxKeyLen is the longest idempotency key, scope or request hash, in bytes.
// The IETF draft sets no limit; 255 matches Stripe's and leaves keys
// comfortably indexable.
const MaxKeyLen = 255

// ValidateKey reports whether key is acceptable to Do: 1 to 255 bytes of
// valid UTF-8 with no control characters (C0, DEL or C1, NUL included). The
// error wraps ErrInvalidKey and says what was wrong. Any printable text is
// accepted, not only UUIDs: clients choose their keys.
func ValidateKey(key string) error {
	if key == "" {
		return inputError(ErrInvalidKey, "empty")
	}
	return validateText(ErrInvalidKey, key)
}

// ValidateScope reports whether scope is acceptable as a key's namespace:
// empty (the shared namespace), or up to 255 bytes of valid UTF-8 with no
// control characters. The error wraps ErrInvalidScope and says what was
// wrong.
func ValidateScope(scope string) error {
	if scope == "" {
		return nil
	}
	return validateText(ErrInvalidScope, scope)
}

func validateRequestHash(h string) error {
	if h == "" {
		return inputError(ErrInvalidRequestHash, "empty")
	}
	return validateText(ErrInvalidRequestHash, h)
}

func validateText(sentinel error, s string) error {
	if len(s) > MaxKeyLen {
		return inputError(sentinel, "%d bytes, longer than %d", len(s), MaxKeyLen)
	}
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				return inputError(sentinel, "invalid UTF-8 at byte %d", i)
			}
		}
		if unicode.IsControl(r) {
			return inputError(sentinel, "control character %U at byte %d", r, i)
		}
	}
	return nil
}

// storableText returns s as a text column stores it: invalid UTF-8 replaced
// by U+FFFD, NUL written as the six characters \u0000 (PostgreSQL's text
// refuses both, and a statement refused for them would fail silently where
// it records why something stopped), and cut to at most limit bytes at a
// character boundary.
func storableText(s string, limit int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\u0000`)
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
