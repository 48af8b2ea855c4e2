package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/schema"
	"github.com/idemhq/idem/testkit/pgurl"
)

// sample is the state of the key table at one moment.
type sample struct {
	at         time.Duration // since the load started
	cleanup    bool
	keys       int64 // Do calls that executed so far
	bytes      int64 // the table with indexes, TOAST and partitions
	rows       int64 // n_live_tup over the leaves
	dead       int64 // n_dead_tup over the table's leaves
	partitions int
	walBytes   int64 // WAL written since the load started
}

// sweepRun is one Sweep while cleanup runs.
type sweepRun struct {
	at      time.Duration
	took    time.Duration
	removed int64
}

type result struct {
	layout  string
	samples []sample
	sweeps  []sweepRun
	// keys executed and load time, without and with cleanup
	keysA, keysB int64
	timeA, timeB time.Duration
	walA, walB   int64
	sweepErrs    int
}

func measure(ctx context.Context, o options, server *pgx.ConnConfig, db, layout string) (*result, error) {
	url := pgurl.WithDatabase(server.ConnString(), db)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(o.workers + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if layout == "plain" {
		err = schema.Apply(ctx, pool)
	} else {
		err = schema.ApplyPartitioned(ctx, pool, "", o.interval)
	}
	if err != nil {
		return nil, err
	}
	keys, err := idem.NewClient(pool, &idem.Config{TTL: o.ttl})
	if err != nil {
		return nil, err
	}
	if layout == "partitioned" {
		// Partitions ahead before the load, as a deployment's sweeper would
		// have made them; no partition is dropped yet (nothing expired).
		if _, err := keys.Sweep(ctx); err != nil {
			return nil, err
		}
	}

	r := &result{layout: layout}
	var executed atomic.Int64
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	var loadErr error
	var errOnce sync.Once
	start := time.Now()
	type receipt struct {
		ID     int64  `json:"id"`
		Status string `json:"status"`
		Note   string `json:"note"`
	}
	for w := range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; loadCtx.Err() == nil; i++ {
				key := fmt.Sprintf("w%02d-%09d", w, i)
				_, err := idem.Do(loadCtx, keys, key, "request-hash-v1", func(pgx.Tx) (receipt, error) {
					return receipt{ID: int64(i), Status: "succeeded", Note: "a small stored result, about the size of a payment receipt"}, nil
				})
				if err != nil && loadCtx.Err() == nil {
					errOnce.Do(func() { loadErr = fmt.Errorf("idem.Do %s: %w", key, err) })
					stopLoad()
					return
				}
				if err == nil {
					executed.Add(1)
				}
			}
		}()
	}

	lsn := func() (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").Scan(&n)
		return n, err
	}
	lsn0, err := lsn()
	if err != nil {
		return nil, err
	}
	take := func(cleanup bool) error {
		s := sample{at: time.Since(start), cleanup: cleanup, keys: executed.Load()}
		err := pool.QueryRow(ctx, `
			SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint,
			       coalesce(sum(s.n_live_tup) FILTER (WHERE t.isleaf), 0)::bigint,
			       coalesce(sum(s.n_dead_tup) FILTER (WHERE t.isleaf), 0)::bigint,
			       count(*) FILTER (WHERE t.isleaf AND t.level > 0)::int,
			       pg_current_wal_lsn() - '0/0'::pg_lsn
			FROM (SELECT relid, isleaf, level FROM pg_partition_tree('idempotency_keys')
			      UNION ALL -- pg_partition_tree lists nothing for a plain table
			      SELECT 'idempotency_keys'::regclass, true, 0
			      WHERE (SELECT relkind FROM pg_class WHERE oid = 'idempotency_keys'::regclass) <> 'p') t
			JOIN pg_class c ON c.oid = t.relid
			LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid`).
			Scan(&s.bytes, &s.rows, &s.dead, &s.partitions, &s.walBytes)
		s.walBytes -= lsn0
		r.samples = append(r.samples, s)
		return err
	}

	// Phase A: load without cleanup. The partitioned table still gets its
	// partitions made ahead (schema.ApplyPartitioned runs the same step as
	// Sweep), since that is not cleanup: only drops are held back.
	phaseA := o.duration / 3
	partitionsSQL, err := schema.PartitionsSQL("idempotency_keys")
	if err != nil {
		return nil, err
	}
	makeAhead := func() error {
		if layout != "partitioned" {
			return nil
		}
		// What Sweep does first, with the same lock timeout.
		return pgx.BeginFunc(loadCtx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(loadCtx, "SET LOCAL lock_timeout = '200ms'"); err != nil {
				return err
			}
			_, err := tx.Exec(loadCtx, partitionsSQL)
			if pgCode(err) == "55P03" {
				return nil // try again at the next round
			}
			return err
		})
	}
	nextMake := time.Now()
	if err := sampleUntil(loadCtx, start, phaseA, min(o.sample, o.sweepEvery), func() error {
		if time.Now().After(nextMake) {
			nextMake = time.Now().Add(o.sweepEvery)
			if err := makeAhead(); err != nil {
				return err
			}
		}
		if len(r.samples) == 0 || time.Since(start)-r.samples[len(r.samples)-1].at >= o.sample-o.sample/10 {
			return take(false)
		}
		return nil
	}); err != nil && loadCtx.Err() == nil {
		return nil, err
	}
	r.keysA, r.timeA = executed.Load(), time.Since(start)
	walA, err := lsn()
	if err != nil {
		return nil, err
	}
	r.walA = walA - lsn0

	// Phase B: the same load with Sweep every sweepEvery. The first sweep
	// meets the backlog of phase A and runs flat out.
	sweepCtx, stopSweep := context.WithCancel(loadCtx)
	defer stopSweep()
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		t := time.NewTicker(o.sweepEvery)
		defer t.Stop()
		for {
			at := time.Since(start)
			n, err := keys.Sweep(sweepCtx)
			if sweepCtx.Err() != nil {
				return
			}
			if err != nil {
				r.sweepErrs++
			}
			r.sweeps = append(r.sweeps, sweepRun{at: at, took: time.Since(start) - at, removed: n})
			select {
			case <-sweepCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	sampleErr := sampleUntil(loadCtx, start, o.duration, o.sample, func() error { return take(true) })
	stopLoad()
	wg.Wait()
	stopSweep()
	<-sweepDone
	if loadErr != nil {
		return nil, loadErr
	}
	if sampleErr != nil && ctx.Err() == nil && !errors.Is(sampleErr, context.Canceled) {
		return nil, sampleErr
	}
	walEnd, err := lsn()
	if err != nil {
		return nil, err
	}
	r.keysB, r.timeB = executed.Load()-r.keysA, time.Since(start)-r.timeA
	r.walB = walEnd - lsn0 - r.walA
	return r, ctx.Err()
}

// sampleUntil calls f every period until until has passed since start.
func sampleUntil(ctx context.Context, start time.Time, until, period time.Duration, f func() error) error {
	for {
		if err := f(); err != nil {
			return err
		}
		left := until - time.Since(start)
		if left <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(period, left)):
		}
	}
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
