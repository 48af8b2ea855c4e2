package idem

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/dbtx"
)

// An execer runs a statement: *pgxpool.Pool, *pgx.Conn and pgx.Tx all do.
type execer = dbtx.Execer

// Sweep deletes the Client's expired keys and returns how many it deleted.
// A key is expired once its TTL has passed since it completed. Sweep deletes
// in batches of Config.SweepBatchSize (DefaultSweepBatchSize), each its own
// statement, so no lock is held for long and rows being replaced by a
// concurrent call are skipped rather than waited for. It stops when a batch
// comes back short, or when ctx ends (returning what it deleted so far and
// ctx's error).
//
// On a pool or connection each batch commits on its own; a connection lost
// before a batch's reply is an error wrapping ErrOutcomeUnknown, and the
// count covers only the batches confirmed (the lost one's keys had expired
// either way). On a Client made with On(tx), the batches commit with that
// transaction.
//
// On a partitioned key table (schema.ApplyPartitioned) Sweep deletes no
// rows but those of the DEFAULT partition: it keeps partitions made ahead
// and drops each partition once every key in it has expired, counting its
// keys as deleted (see PartitionLockTimeout; in an outer transaction it only
// sweeps the DEFAULT partition). Where the pg_partman extension manages the
// table, Sweep runs pg_partman's maintenance for it instead of making and
// dropping partitions itself. Each Sweep asks the catalog which layout the
// table has. A missing table is an error that says to apply the schema.
func (c *Client) Sweep(ctx context.Context) (int64, error) {
	return sweep(ctx, c.execer(), &c.base)
}

func sweep(ctx context.Context, db execer, s *settings) (int64, error) {
	m, ok := maintainerOf(db)
	if !ok {
		// An execer that can neither query nor begin: it cannot learn the
		// layout, so the batches refuse a partitioned table (the plain
		// statement's ctids would be ambiguous across partitions).
		if _, err := db.Exec(ctx, plainOnlySQL, s.table); err != nil {
			return 0, tableError(s.table, "sweep "+s.table, err)
		}
		return sweepRows(ctx, db, s.stmts.sweep, s)
	}
	stmts, err := m.layout(ctx, s.stmts)
	if err != nil {
		return 0, fmt.Errorf("idem: sweep %s: %w", s.table, err)
	}
	if stmts.isPartitioned {
		return sweepPartitioned(ctx, db, m, s)
	}
	return sweepRows(ctx, db, stmts.sweep, s)
}

// sweepRows runs a batched DELETE (sweep.sql, possibly retargeted at a
// DEFAULT partition) until a batch comes back short.
func sweepRows(ctx context.Context, db execer, sql string, s *settings) (int64, error) {
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		tag, err := db.Exec(ctx, sql, s.batch)
		if err != nil {
			// The batch is its own transaction: without its reply, whether
			// it deleted its (expired) keys is unknown, and total counts
			// only the batches confirmed.
			if _, inTx := db.(pgx.Tx); !inTx && dbtx.CommitOutcomeUnknown(err) {
				return total, fmt.Errorf("%w: sweep %s: a batch's reply was lost: %w", ErrOutcomeUnknown, s.table, err)
			}
			return total, tableError(s.table, "sweep "+s.table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(s.batch) {
			return total, nil
		}
	}
}

// SweepEvery runs c.Sweep now and then every interval until ctx ends, and
// returns ctx's error. A failed sweep is retried at the next tick and
// reported to onError, if given, and to Config.Logger, if set; with neither,
// to slog.Default(), so that no failure is lost. Each sweep that deleted
// keys is logged at debug level with the count.
func (c *Client) SweepEvery(ctx context.Context, interval time.Duration, onError func(error)) error {
	return sweepEvery(ctx, c.execer(), &c.base, interval, onError)
}

func sweepEvery(ctx context.Context, db execer, s *settings, interval time.Duration, onError func(error)) error {
	if interval <= 0 {
		return inputError(ErrInvalidOption, "SweepEvery interval %v: must be positive", interval)
	}
	log := s.logger
	if log == nil && onError == nil {
		log = slog.Default()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := sweep(ctx, db, s)
		switch {
		case err != nil && ctx.Err() == nil:
			if onError != nil {
				onError(err)
			}
			if log != nil {
				log.ErrorContext(ctx, "idem: sweep failed; retrying at the next interval", "table", s.table, "deleted", n, "err", err, "next", interval)
			}
		case err == nil && n > 0 && log != nil:
			log.DebugContext(ctx, "idem: swept expired keys", "table", s.table, "deleted", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// execer is the Client's database as an execer: itself when it is one
// (pools, connections, transactions), else a transaction per statement.
func (c *Client) execer() execer {
	if e, ok := c.db.(execer); ok {
		return e
	}
	return txExecer{c.db}
}

type txExecer struct{ db Beginner }

func (e txExecer) Exec(ctx context.Context, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	err = pgx.BeginFunc(ctx, e.db, func(tx pgx.Tx) error {
		tag, err = tx.Exec(ctx, sql, args...)
		return err
	})
	return tag, err
}
