package idem

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/idemhq/idem/internal/sqltext"
)

var (
	//go:embed sql/stats.sql
	statsSQL string
	//go:embed sql/stats_citus.sql
	statsCitusSQL string
)

// StatsExpiredLimit is the most expired keys Client.Stats counts: past it,
// Stats.Expired reads StatsExpiredLimit and the sweeper is that far behind
// at least. The bound keeps Stats cheap when the backlog is largest.
const StatsExpiredLimit = 100_000

// Stats is the health of a key table at one moment, for dashboards and
// alerts: Client.Stats reads it. Some figures are exact at the moment of
// the query, others are PostgreSQL's estimates; each field says which.
type Stats struct {
	// Table is the key table.
	Table string

	// Rows estimates the committed rows of the table, live or expired:
	// the planner's estimate (pg_class.reltuples, kept by autovacuum and
	// ANALYZE, scaled to the table's current size). Estimated; -1 while no
	// VACUUM or ANALYZE has measured the table yet.
	Rows int64

	// Live estimates the keys that still replay: Rows minus Expired and
	// Unfinished, at least 0. Estimated; -1 when Rows is.
	Live int64

	// Expired counts the keys whose TTL has passed and that wait for the
	// sweeper (those whose claim is older than the TTL: a key completed d
	// after its claim replays for d more, so it may be counted up to d
	// early). Exact, up to StatsExpiredLimit. It stays near 0 while a
	// sweeper (Client.SweepEvery) keeps up.
	Expired int64

	// InProgress counts the keys that open transactions hold right now:
	// their claims are uncommitted rows, which no query on the table can
	// see, so they are read from the claims' advisory locks in pg_locks.
	// Exact at the moment of the query (two keys whose lock hashes collide
	// count once; Lookup and Forget hold a lock for one statement).
	InProgress int64

	// OldestInProgress is how long the oldest key in progress has been
	// held: the age of its transaction (pg_stat_activity.xact_start), which
	// for a call in an outer transaction began before the claim. Exact; 0
	// when no key is in progress. Reading other roles' sessions needs the
	// pg_read_all_stats role; without it their keys count in InProgress
	// but not here.
	OldestInProgress time.Duration

	// TableBytes is the size of the table on disk with its indexes and
	// TOAST data (pg_total_relation_size). Exact.
	TableBytes int64

	// Unfinished counts the operations made of steps (Operation) that have
	// begun and not stored their answer: being worked on, or waiting for a
	// retry or the completer. Exact. A count that grows, or an
	// OldestUnfinished past the operations' deadlines, means no completer
	// is driving them to their end.
	Unfinished int64

	// OldestUnfinished is the age of the oldest unfinished operation,
	// counted from its beginning (the transaction that begins it). Exact; 0 when none is unfinished.
	OldestUnfinished time.Duration
}

// Stats reads the health of the Client's key table: keys live, expired
// and in progress, the age of the oldest key in progress, the table's size,
// and the unfinished operations. It costs two statements: one that reads
// catalog figures, the lock table and the expired end of the index on
// expires_at, never the whole table, and one that counts the unfinished
// operations (a table that holds only those), so it suits a metrics scrape
// on a table of millions of keys. On a Citus cluster, where the key table on
// the node a call enters through is an empty shell, a third statement
// reads the shards' figures and every node's lock table (stats_citus.sql). It takes no lock and writes nothing. ctx
// governs the statements. A missing key table is an error that says to
// apply the schema.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	t, err := sqltext.ParseTable(c.base.table)
	if err != nil {
		return Stats{}, fmt.Errorf("%w: %w", ErrInvalidTable, err)
	}
	st := Stats{Table: c.base.table}
	var (
		oldestMicros int64
		citus        bool
	)
	err = c.query(ctx, func(q querier) error {
		err := q.QueryRow(ctx, t.Rewrite(statsSQL), StatsExpiredLimit).
			Scan(&st.Rows, &st.Expired, &st.InProgress, &oldestMicros, &st.TableBytes, &citus)
		if err != nil || !citus {
			return err
		}
		return q.QueryRow(ctx, t.Rewrite(statsCitusSQL), StatsExpiredLimit).
			Scan(&st.Rows, &st.Expired, &st.InProgress, &oldestMicros, &st.TableBytes)
	})
	if err != nil {
		return Stats{}, tableError(c.base.table, "stats of "+c.base.table, err)
	}
	st.OldestInProgress = time.Duration(oldestMicros) * time.Microsecond
	err = c.query(ctx, func(q querier) error {
		return q.QueryRow(ctx, c.base.stmts.op.stats).Scan(&st.Unfinished, &oldestMicros)
	})
	if err != nil {
		return Stats{}, tableError(c.base.table, "stats of "+c.base.table, err)
	}
	st.OldestUnfinished = time.Duration(oldestMicros) * time.Microsecond
	st.Live = -1
	if st.Rows >= 0 {
		st.Live = max(st.Rows-st.Expired-st.Unfinished, 0)
	}
	return st, nil
}
