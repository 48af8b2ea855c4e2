package settlement

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Migrate creates or upgrades River's own tables (river_job and the
// others) with rivermigrate. It is safe to run on every start, by several
// processes at once: they take turns under a session advisory lock.
// (River's migrations cannot share one transaction: one adds a value to an
// enum that a later one uses.)
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("settlement: %w", err)
	}
	lock, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("settlement: migrate River's tables: %w", err)
	}
	defer lock.Release()
	const key = "SELECT %s(7306086, hashtext('river migrations'))"
	if _, err := lock.Exec(ctx, fmt.Sprintf(key, "pg_advisory_lock")); err != nil {
		return fmt.Errorf("settlement: lock the migration: %w", err)
	}
	defer func() {
		if _, unlockErr := lock.Exec(context.WithoutCancel(ctx), fmt.Sprintf(key, "pg_advisory_unlock")); unlockErr != nil {
			// A connection that may still hold the lock must not go back
			// to the pool.
			_ = lock.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("settlement: migrate River's tables: %w", err)
	}
	return nil
}
