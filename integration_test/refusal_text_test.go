package integration_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// TestRefusalTextJSONBCannotHold stores refusals whose code or message jsonb
// cannot hold: U+0000, which the refusal column refuses even escaped
// (SQLSTATE 22P05), and invalid UTF-8. Any client that chooses a message's
// text (an echoed field, a gRPC status message) could otherwise make every
// attempt fail. Each must be stored, and replayed exactly.
func TestRefusalTextJSONBCannotHold(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		for i, r := range []*idem.Refusal{
			idem.Refuse("declined", "card \x00 declined").WithStatus(402),
			idem.Refuse("bad\x00code", ""),
			idem.Refuse("declined", "not utf-8: \xff\xfe"),
		} {
			key := string(rune('a' + i))
			runs := 0
			fn := func(tx pgx.Tx) (int, error) {
				runs++
				return 7, r
			}
			first, outcome, err := run(ctx, t, s, v, key, "h", fn)
			if outcome != idem.OutcomeRefused || first != 7 {
				t.Fatalf("%q: %d, %v, %v; want the refusal stored", r.Message, first, outcome, err)
			}
			again, outcome, err := run(ctx, t, s, v, key, "h", fn)
			var got *idem.Refusal
			if outcome != idem.OutcomeReplayed || again != 7 || !errors.As(err, &got) || *got != *r || runs != 1 {
				t.Fatalf("replay of %+v: %d, %v, %+v; fn ran %d times", r, again, outcome, got, runs)
			}
		}
	})
}
