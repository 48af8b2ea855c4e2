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

// tableStats is what stats reports about a key table.
type tableStats struct {
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

// statsSource reports on a key table. The command reads it with SQL of its
// own (sqlStats); a Client's own report can stand in for it.
type statsSource interface {
	stats(ctx context.Context) (tableStats, error)
}

var (
	//go:embed sql/stats_counts.sql
	statsCountsSQL string
	//go:embed sql/stats_locks.sql
	statsLocksSQL string
	//go:embed sql/stats_partitions.sql
	statsPartitionsSQL string
)

type sqlStats struct {
	pool  *pgxpool.Pool
	table string
}

func newSQLStats(pool *pgxpool.Pool, table string) statsSource {
	return sqlStats{pool: pool, table: table}
}

func (s sqlStats) stats(ctx context.Context) (tableStats, error) {
	st := tableStats{Table: s.table}
	var relkind string
	if err := s.pool.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", s.table).Scan(&relkind); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return st, fmt.Errorf("no table %s (run: idem migrate)", s.table)
		}
		return st, err
	}
	st.Partitioned = relkind == "p"
	// The table's name is checked by to_regclass above and printed back by
	// PostgreSQL, quoted as needed; the counts read the table itself.
	var name string
	if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1)::text", s.table).Scan(&name); err != nil {
		return st, err
	}
	if err := s.pool.QueryRow(ctx, retarget(statsCountsSQL, name)).Scan(&st.Live, &st.Expired); err != nil {
		return st, fmt.Errorf("count keys: %w", err)
	}
	var oldest *time.Duration
	if err := s.pool.QueryRow(ctx, statsLocksSQL, s.table).Scan(&st.InProgress, &oldest); err != nil {
		return st, fmt.Errorf("count keys in progress: %w", err)
	}
	if oldest != nil {
		st.OldestInProgress = *oldest
	}
	rows, err := s.pool.Query(ctx, statsPartitionsSQL, s.table)
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

func stats(ctx context.Context, src statsSource, w io.Writer) error {
	st, err := src.stats(ctx)
	if err != nil {
		return err
	}
	layout := "plain"
	if st.Partitioned {
		layout = fmt.Sprintf("partitioned (%d partitions)", len(st.Partitions))
	}
	fmt.Fprintf(w, "table:              %s, %s\n", st.Table, layout)
	fmt.Fprintf(w, "live keys:          %d\n", st.Live)
	fmt.Fprintf(w, "in progress:        %d", st.InProgress)
	if st.InProgress > 0 {
		fmt.Fprintf(w, " (oldest running for %s)", st.OldestInProgress.Round(time.Millisecond))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "expired, unswept:   %d\n", st.Expired)
	fmt.Fprintf(w, "size:               %s\n", size(st.Bytes))
	for _, p := range st.Partitions {
		mark := ""
		if p.IsTarget {
			mark = "  <- now"
		}
		fmt.Fprintf(w, "  %-40s %-62s ~%d rows, %s%s\n", p.Name, p.Bounds, p.Rows, size(p.Bytes), mark)
	}
	return nil
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
