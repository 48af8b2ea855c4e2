package idem

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/sqltext"
	"github.com/idemhq/idem/schema"
)

var (
	//go:embed sql/partition_expiry.sql
	partitionExpirySQL string
	//go:embed sql/partition_barrier.sql
	partitionBarrierSQL string
	//go:embed sql/partition_census.sql
	partitionCensusSQL string
	//go:embed sql/partition_drop.sql
	partitionDropSQL string
)

// PartitionLockTimeout bounds how long each step of a partitioned table's
// maintenance (making partitions, closing and dropping one) waits for its
// lock. Those locks conflict with every claim, and a claim that arrives
// while a step waits queues behind it, so this is also the longest a claim
// is held up by maintenance. A step that times out is skipped and tried
// again by the next Sweep.
const PartitionLockTimeout = 200 * time.Millisecond

// maintainer runs the steps of a sweep in transactions: its own, one per
// step (given a pool, a connection or a Client's database), or savepoints
// of the caller's transaction (given a pgx.Tx).
type maintainer struct {
	db       Beginner
	callerTx bool
}

func maintainerOf(db execer) (maintainer, bool) {
	switch d := db.(type) {
	case pgx.Tx:
		return maintainer{db: d, callerTx: true}, true
	case txExecer:
		return maintainer{db: d.db}, true
	case Beginner:
		return maintainer{db: d}, true
	}
	return maintainer{}, false
}

// tx runs f in a transaction of its own, or a savepoint of the caller's.
func (m maintainer) tx(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, m.db, f)
}

// lockTimeout bounds the lock waits of the rest of tx.
func lockTimeout(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", fmt.Sprintf("%dms", PartitionLockTimeout.Milliseconds()))
	return err
}

// layout resolves s's layout through a short transaction.
func (m maintainer) layout(ctx context.Context, s *statements) (st *statements, err error) {
	err = m.tx(ctx, func(tx pgx.Tx) error {
		st, err = resolveQuerier(ctx, tx, s)
		return err
	})
	return st, err
}

// A partition of a key table, as partitions.sql lists it.
type partition struct {
	name        string // as a regclass prints: quoted and qualified as needed
	schema, rel string
	isDefault   bool
	lo, hi      *time.Time
	past        bool // the range has passed
}

// sweepPartitioned maintains a partitioned key table and returns how many
// keys it removed: those of the partitions it dropped and those it deleted
// from the DEFAULT partition.
//
// Where pg_partman manages the table, its run_maintenance makes and drops
// the partitions; otherwise Sweep does:
//
//   - It makes the partitions of the present and the next three intervals
//     (schema/partitioned/002_idempotency_keys_partitions.sql).
//   - It drops a partition once its range has passed and every key in it
//     has expired: partition_expiry.sql rules it out cheaply while any
//     expires_at lies ahead, partition_barrier.sql makes sure no row can
//     still enter it, partition_census.sql counts its live keys, and
//     partition_drop.sql drops it if there are none.
//
// Either way it then deletes the expired keys of the DEFAULT partition in
// batches, as on the plain table. Given a pgx.Tx (savepoints of it hold
// their locks until it ends), Sweep only does that last step.
//
// Lock waits are bounded by PartitionLockTimeout; a step that times out is
// skipped until the next Sweep and reported to Config.Logger, not as an
// error.
func sweepPartitioned(ctx context.Context, db execer, m maintainer, s *settings) (int64, error) {
	var (
		total int64
		errs  []error
	)
	if !m.callerTx {
		managed, err := m.partman(ctx, s)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !managed:
			if err := m.makePartitions(ctx, s); err != nil {
				errs = append(errs, err)
			}
		}
		if err == nil && !managed {
			n, err := m.dropExpired(ctx, s)
			total += n
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	parts, err := m.partitions(ctx, s)
	if err != nil {
		return total, errors.Join(append(errs, err)...)
	}
	for _, p := range parts {
		if !p.isDefault {
			continue
		}
		n, err := sweepRows(ctx, db, sqltext.Retarget(sweepSQL, p.name), s)
		total += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

func (m maintainer) partitions(ctx context.Context, s *settings) ([]partition, error) {
	var parts []partition
	err := m.tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, partitionsSQL, s.table)
		if err != nil {
			return err
		}
		parts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (partition, error) {
			var p partition
			err := r.Scan(&p.name, &p.schema, &p.rel, &p.isDefault, &p.lo, &p.hi, &p.past)
			return p, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idem: list the partitions of %s: %w", s.table, err)
	}
	return parts, nil
}

// partman reports whether pg_partman manages the table, and if so runs its
// maintenance for it.
func (m maintainer) partman(ctx context.Context, s *settings) (managed bool, err error) {
	var ext, parent string
	err = m.tx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, partmanSQL, s.table).Scan(&ext, &parent)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		// The extension's schema comes from the catalog, quoted as a
		// regnamespace prints.
		return tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+ext+".part_config WHERE parent_table = $1)", parent).Scan(&managed)
	})
	if err != nil || !managed {
		return false, wrapMaint(s, "ask pg_partman", err)
	}
	err = m.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT "+ext+".run_maintenance(p_parent_table := $1)", parent)
		return err
	})
	return true, wrapMaint(s, "run pg_partman's maintenance", err)
}

// makePartitions makes the partitions of the present and the near future.
func (m maintainer) makePartitions(ctx context.Context, s *settings) error {
	// The schema's own file (schema/partitioned/002...), for this table.
	sql, err := schema.PartitionsSQL(s.table)
	if err != nil {
		return err
	}
	err = m.tx(ctx, func(tx pgx.Tx) error {
		if err := lockTimeout(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql)
		return err
	})
	if isLockTimeout(err) {
		s.logLockTimeout(ctx, "make partitions", s.table)
		return nil
	}
	return wrapMaint(s, "make partitions", err)
}

// dropExpired drops every partition whose range has passed and whose keys
// have all expired, and returns how many keys they held.
func (m maintainer) dropExpired(ctx context.Context, s *settings) (int64, error) {
	parts, err := m.partitions(ctx, s)
	if err != nil {
		return 0, err
	}
	// The newest range partition stays, even empty and past: the partitions
	// made next take their interval from it.
	var newest *time.Time
	for _, p := range parts {
		if p.hi != nil && (newest == nil || p.hi.After(*newest)) {
			newest = p.hi
		}
	}
	var total int64
	for _, p := range parts {
		if p.isDefault || !p.past || p.hi == nil || p.hi.Equal(*newest) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, dropped, err := m.dropIfExpired(ctx, p)
		switch {
		case isLockTimeout(err):
			s.logLockTimeout(ctx, "drop partition", p.name)
		case err != nil:
			return total, wrapMaint(s, "drop partition "+p.name, err)
		case dropped:
			total += n
		}
	}
	return total, nil
}

func (m maintainer) dropIfExpired(ctx context.Context, p partition) (keys int64, dropped bool, err error) {
	var expired bool
	err = m.tx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqltext.Retarget(partitionExpirySQL, p.name), pgx.QueryExecModeSimpleProtocol).Scan(&expired)
	})
	if err != nil || !expired {
		return 0, false, err
	}
	// The barrier commits before the census reads: the census must not hold
	// the lock, which would stop every claim while it reads the partition.
	if err := m.lockedExec(ctx, sqltext.Retarget(partitionBarrierSQL, p.name)); err != nil {
		return 0, false, err
	}
	var live int64
	err = m.tx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqltext.Retarget(partitionCensusSQL, p.name), pgx.QueryExecModeSimpleProtocol).Scan(&keys, &live)
	})
	if err != nil || live > 0 {
		return 0, false, err
	}
	if err := m.lockedExec(ctx, sqltext.Retarget(partitionDropSQL, p.name)); err != nil {
		return 0, false, err
	}
	return keys, true, nil
}

// lockedExec runs sql, a statement that takes the key table's lock, in a
// transaction of its own that waits for the lock at most
// PartitionLockTimeout.
func (m maintainer) lockedExec(ctx context.Context, sql string) error {
	return m.tx(ctx, func(tx pgx.Tx) error {
		if err := lockTimeout(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
		return err
	})
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable
}

func wrapMaint(s *settings, what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("idem: sweep %s: %s: %w", s.table, what, err)
}

func (s *settings) logLockTimeout(ctx context.Context, what, name string) {
	if s.logger != nil {
		s.logger.InfoContext(ctx, "idem: sweep: lock not granted in time; trying again at the next sweep",
			"table", s.table, "step", what, "relation", name, "lock_timeout", PartitionLockTimeout)
	}
}
