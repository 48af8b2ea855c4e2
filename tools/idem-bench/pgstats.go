package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// tableStats sums the write counters of one schema's tables.
type tableStats struct {
	dead, upd, hotUpd int64
}

func (a tableStats) sub(b tableStats) tableStats {
	return tableStats{a.dead - b.dead, a.upd - b.upd, a.hotUpd - b.hotUpd}
}

// readStats makes every backend of the pools publish its pending table
// statistics, then reads them per schema ("" for public). PostgreSQL 15
// backends flush statistics at most once a second when they go idle;
// pg_stat_force_next_flush makes the next idle transition flush at once.
func readStats(ctx context.Context, admin *pgxpool.Pool, pools ...*pgxpool.Pool) (map[string]tableStats, error) {
	for _, p := range append(pools, admin) {
		for _, c := range p.AcquireAllIdle(ctx) {
			_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
			c.Release()
			if err != nil {
				return nil, err
			}
		}
	}
	rows, err := admin.Query(ctx, `
SELECT CASE schemaname WHEN 'public' THEN '' ELSE schemaname || '.' END,
       sum(n_dead_tup)::bigint, sum(n_tup_upd)::bigint, sum(n_tup_hot_upd)::bigint
FROM pg_stat_user_tables
WHERE schemaname IN ('public', 'bare', 'peer', 'peertx', 'eager', 'atend')
GROUP BY schemaname`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]tableStats{}
	for rows.Next() {
		var schema string
		var s tableStats
		if err := rows.Scan(&schema, &s.dead, &s.upd, &s.hotUpd); err != nil {
			return nil, err
		}
		out[schema] = s
	}
	return out, rows.Err()
}
