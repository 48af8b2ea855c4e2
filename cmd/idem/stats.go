package main

import (
	"context"
	"fmt"
	"io"

	"github.com/idemhq/idem/idem"
)

// stats prints Client.Stats: estimates and exact figures that cost no scan
// of the table, as a metrics scrape reads them.
func stats(ctx context.Context, keys *idem.Client, w io.Writer) error {
	st, err := keys.Stats(ctx)
	if err != nil {
		return err
	}
	estimate := func(n int64) string {
		if n < 0 {
			return "unknown (no VACUUM or ANALYZE has measured the table yet)"
		}
		return fmt.Sprintf("~%d (estimated)", n)
	}
	expired := fmt.Sprint(st.Expired)
	if st.Expired >= idem.StatsExpiredLimit {
		expired += " or more"
	}
	say(w, "table:              %s", st.Table)
	say(w, "rows:               %s", estimate(st.Rows))
	say(w, "live keys:          %s", estimate(st.Live))
	say(w, "in progress:        %d%s", st.InProgress, oldest(st.InProgress, st.OldestInProgress))
	say(w, "expired, unswept:   %s", expired)
	say(w, "size:               %s", size(st.TableBytes))
	say(w, "unfinished ops:     %d%s", st.Unfinished, oldest(st.Unfinished, st.OldestUnfinished))
	return nil
}
