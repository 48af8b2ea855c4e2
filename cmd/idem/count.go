package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/sqltext"
)

// tableCount is what count reports about a key table, read by scanning it.
type tableCount struct {
	Table       string
	Partitioned bool
	// Live keys replay; Expired keys await the sweeper (including rows left
	// 'in_progress' by a transaction that committed without completing).
	Live, Expired int64
	// InProgress is how many transactions hold a key right now, and
	// OldestInProgress how long the oldest of them has run.
	InProgress       int64
	OldestInProgress time.Duration
	// Bytes is the table's size with its indexes, TOAST and partitions.
	Bytes      int64
	Partitions []partitionStats
}

type partitionStats struct {
	Name     string
	Bounds   string
	Rows     int64 // the planner's estimate
	Bytes    int64
	IsTarget bool // holds the present
}

var (
	//go:embed sql/count_rows.sql
	countRowsSQL string
	//go:embed sql/count_locks.sql
	countLocksSQL string
	//go:embed sql/count_partitions.sql
	countPartitionsSQL string
)

// countTable reads the whole table, every partition, to count its keys
// exactly: unlike Client.Stats (the stats command), which reads estimates
// and never scans, it costs a sequential scan of the table.
func countTable(ctx context.Context, pool *pgxpool.Pool, table string) (tableCount, error) {
	st := tableCount{Table: table}
	var relkind string
	if err := pool.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", table).Scan(&relkind); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return st, fmt.Errorf("the key table %s does not exist: apply the schema with `idem migrate` (or schema.ApplyTable)", table)
		}
		return st, err
	}
	st.Partitioned = relkind == "p"
	// The table's name is checked by to_regclass above and printed back by
	// PostgreSQL, quoted as needed; the counts read the table itself.
	var name string
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1)::text", table).Scan(&name); err != nil {
		return st, err
	}
	if err := pool.QueryRow(ctx, retarget(countRowsSQL, name)).Scan(&st.Live, &st.Expired); err != nil {
		return st, fmt.Errorf("count keys: %w", err)
	}
	var oldest *time.Duration
	if err := pool.QueryRow(ctx, countLocksSQL, table).Scan(&st.InProgress, &oldest); err != nil {
		return st, fmt.Errorf("count keys in progress: %w", err)
	}
	if oldest != nil {
		st.OldestInProgress = *oldest
	}
	rows, err := pool.Query(ctx, countPartitionsSQL, table)
	if err != nil {
		return st, fmt.Errorf("partitions: %w", err)
	}
	parts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (partitionStats, error) {
		var p partitionStats
		var bounds *string
		var leaf bool
		err := r.Scan(&p.Name, &bounds, &p.Rows, &p.Bytes, &p.IsTarget, &leaf)
		if bounds != nil {
			p.Bounds = *bounds
		}
		return p, err
	})
	if err != nil {
		return st, fmt.Errorf("partitions: %w", err)
	}
	for _, p := range parts {
		st.Bytes += p.Bytes
		if st.Partitioned && p.Bounds != "" {
			st.Partitions = append(st.Partitions, p)
		}
	}
	return st, nil
}

func count(ctx context.Context, pool *pgxpool.Pool, table string, w io.Writer) error {
	st, err := countTable(ctx, pool, table)
	if err != nil {
		return err
	}
	layout := "plain"
	if st.Partitioned {
		layout = fmt.Sprintf("partitioned (%d partitions)", len(st.Partitions))
	}
	say(w, "table:              %s, %s", st.Table, layout)
	say(w, "live keys:          %d", st.Live)
	say(w, "in progress:        %d%s", st.InProgress, oldest(st.InProgress, st.OldestInProgress))
	say(w, "expired, unswept:   %d", st.Expired)
	say(w, "size:               %s", size(st.Bytes))
	for _, p := range st.Partitions {
		mark := ""
		if p.IsTarget {
			mark = "  <- now"
		}
		say(w, "  %-40s %-62s ~%d rows, %s%s", p.Name, p.Bounds, p.Rows, size(p.Bytes), mark)
	}
	return nil
}

func oldest(n int64, d time.Duration) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (oldest running for %s)", d.Round(time.Millisecond))
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// retarget points a statement written against idempotency_keys at the
// table being reported on (a name PostgreSQL printed, quoted as needed).
func retarget(sql, table string) string { return sqltext.Retarget(sql, table) }
