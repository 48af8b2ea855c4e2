package idem_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/schema"
	"github.com/idemhq/idem/testkit/holdkeys"
	"github.com/idemhq/idem/testkit/testdb"
)

func TestStats(t *testing.T) {
	ctx := context.Background()
	// Room for the held keys, the other table's and the test's own queries.
	pool := testdb.New(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}

	st, err := keys.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Table != idem.DefaultTable || st.Rows != 0 || st.Live != 0 || st.Expired != 0 || st.InProgress != 0 || st.OldestInProgress != 0 || st.TableBytes <= 0 {
		t.Fatalf("empty table: %+v", st)
	}

	const live, expired, inProgress = 10, 5, 3
	for i := range live + expired {
		if _, err := idem.Do(ctx, keys, fmt.Sprintf("done-%d", i), "h", func(pgx.Tx) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
	}
	// Age the last keys past their TTL, as two days would.
	if _, err := pool.Exec(ctx, `
		UPDATE idempotency_keys SET created_at = created_at - interval '2 days',
		       completed_at = completed_at - interval '2 days', expires_at = expires_at - interval '2 days'
		WHERE idempotency_key = ANY ($1)`, keyNames("done", live, live+expired)); err != nil {
		t.Fatal(err)
	}
	// The row count is the planner's estimate: ANALYZE measures it, exactly
	// for a table this small.
	if _, err := pool.Exec(ctx, "ANALYZE idempotency_keys"); err != nil {
		t.Fatal(err)
	}

	release := holdkeys.Hold(t, keys, "held", inProgress)
	heldSince := time.Now() // every holder's transaction began before this
	time.Sleep(50 * time.Millisecond)
	heldFor := time.Since(heldSince)

	// A key held in another table does not count here.
	if err := schema.ApplyTable(ctx, pool, "other_keys"); err != nil {
		t.Fatal(err)
	}
	other, err := idem.NewClient(pool, &idem.Config{Table: "other_keys"})
	if err != nil {
		t.Fatal(err)
	}
	releaseOther := holdkeys.Hold(t, other, "other", 1)

	st, err = keys.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", st)
	if st.Rows != live+expired || st.Live != live || st.Expired != expired || st.InProgress != inProgress {
		t.Fatalf("stats %+v; want %d rows, %d live, %d expired, %d in progress", st, live+expired, live, expired, inProgress)
	}
	if st.OldestInProgress < heldFor {
		t.Fatalf("oldest key in progress held for %v; it has been held for at least %v", st.OldestInProgress, heldFor)
	}
	if st.TableBytes <= 0 {
		t.Fatalf("table size %d", st.TableBytes)
	}

	ost, err := other.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ost.Table != "other_keys" || ost.InProgress != 1 || ost.OldestInProgress <= 0 {
		t.Fatalf("other table: %+v, want 1 key in progress", ost)
	}

	release()
	releaseOther()
	// The held keys committed; the next sweep removes the expired ones.
	if _, err := keys.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	st, err = keys.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.InProgress != 0 || st.OldestInProgress != 0 || st.Expired != 0 {
		t.Fatalf("after release and sweep: %+v; want nothing in progress or expired", st)
	}
}

func keyNames(prefix string, from, to int) []string {
	var names []string
	for i := from; i < to; i++ {
		names = append(names, fmt.Sprintf("%s-%d", prefix, i))
	}
	return names
}
