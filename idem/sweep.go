package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// An Execer runs a statement: *pgxpool.Pool, *pgx.Conn and pgx.Tx all do.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Sweep deletes expired keys and returns how many it deleted. It deletes in
// batches (WithBatchSize, default 1000), each its own statement, so no lock
// is held for long and rows being replaced by a concurrent call are skipped
// rather than waited for. It stops when a batch comes back short, or when
// ctx ends (returning what it deleted so far and ctx's error). Only WithTable
// and WithBatchSize apply.
//
// Given a pool, each batch commits on its own. Given a pgx.Tx, the batches
// commit with that transaction.
func Sweep(ctx context.Context, db Execer, opts ...Option) (int64, error) {
	cfg := newConfig(opts)
	if cfg.err != nil {
		return 0, cfg.err
	}
	stmts, err := statementsFor(cfg.table)
	if err != nil {
		return 0, err
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		tag, err := db.Exec(ctx, stmts.sweep, cfg.batch)
		if err != nil {
			return total, fmt.Errorf("idem: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(cfg.batch) {
			return total, nil
		}
	}
}

// SweepEvery runs Sweep now and then every interval until ctx ends, and
// returns ctx's error. A failed sweep is reported to onError (which may be
// nil) and retried at the next tick: a database that is briefly away must
// not stop the cleanup for good.
//
//	go idem.SweepEvery(ctx, pool, time.Hour, func(err error) { log.Print(err) })
func SweepEvery(ctx context.Context, db Execer, interval time.Duration, onError func(error), opts ...Option) error {
	if interval <= 0 {
		return inputError(ErrInvalidOption, "SweepEvery interval %v: must be positive", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := Sweep(ctx, db, opts...); err != nil && ctx.Err() == nil && onError != nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
