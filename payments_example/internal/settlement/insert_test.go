package settlement_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/payments_example/internal/settlement"
	"github.com/idemhq/idem/testkit/testdb"
)

// probeArgs is a job that only needs inserting.
type probeArgs struct {
	Case string `json:"case"`
}

func (probeArgs) Kind() string { return "probe" }

// migrated returns a pool on a new database with River's tables.
func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.New(t)
	if err := settlement.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestInsertTxThroughIdem checks that River's InsertTx works on the
// transaction idem hands to fn, on each of idem's paths: a pool and a
// *idem.Client (the pipelined connection path, whose pgx.Tx is idem's
// own), a *pgx.Conn (the same path on a connection), and an outer pgx.Tx
// (the nested path, in a savepoint); and inside a savepoint that fn opens
// with tx.Begin. A job exists if and only if the work committed: fn's
// error and a refusal (whose writes roll back to idem's savepoint while
// the key commits) leave none, a rolled-back savepoint of fn's removes
// its job only, and COPY (InsertManyFastTx) works too.
func TestInsertTxThroughIdem(t *testing.T) {
	pool := migrated(t)
	ctx := t.Context()
	// An insert-only client: no queues, no workers.
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	type work func(ctx context.Context, tx pgx.Tx, c string) error
	insert := func(ctx context.Context, tx pgx.Tx, c string) error {
		_, err := rc.InsertTx(ctx, tx, probeArgs{c}, nil)
		return err
	}
	errBoom := errors.New("boom")
	cases := []struct {
		name string
		fn   work
		jobs int // jobs of the case left committed
		err  bool
	}{
		{"commit", insert, 1, false},
		{"fn fails", func(ctx context.Context, tx pgx.Tx, c string) error {
			if err := insert(ctx, tx, c); err != nil {
				return err
			}
			return errBoom
		}, 0, true},
		{"refusal", func(ctx context.Context, tx pgx.Tx, c string) error {
			if err := insert(ctx, tx, c); err != nil {
				return err
			}
			return idem.Refuse("declined", "no")
		}, 0, true},
		{"savepoint committed", func(ctx context.Context, tx pgx.Tx, c string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insert(ctx, sp, c); err != nil {
				return err
			}
			return sp.Commit(ctx)
		}, 1, false},
		{"savepoint rolled back", func(ctx context.Context, tx pgx.Tx, c string) error {
			if err := insert(ctx, tx, c); err != nil { // kept
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insert(ctx, sp, c); err != nil { // undone
				return err
			}
			return sp.Rollback(ctx)
		}, 1, false},
		{"copy", func(ctx context.Context, tx pgx.Tx, c string) error {
			_, err := rc.InsertManyFastTx(ctx, tx, []river.InsertManyParams{{Args: probeArgs{c}}, {Args: probeArgs{c}}})
			return err
		}, 2, false},
	}

	paths := map[string]func(ctx context.Context, key string, fn work, c string) error{
		"pool":   func(ctx context.Context, key string, fn work, c string) error { return run(ctx, pool, key, fn, c) },
		"client": func(ctx context.Context, key string, fn work, c string) error { return run(ctx, keys, key, fn, c) },
		"conn":   func(ctx context.Context, key string, fn work, c string) error { return run(ctx, conn, key, fn, c) },
		"outer tx": func(ctx context.Context, key string, fn work, c string) error {
			var refused error
			err := pgx.BeginFunc(ctx, pool, func(outer pgx.Tx) error {
				err := run(ctx, outer, key, fn, c)
				if _, ok := errors.AsType[*idem.Refusal](err); ok {
					refused = err // the refusal and its key commit with the outer transaction
					return nil
				}
				return err
			})
			return errors.Join(err, refused)
		},
	}
	for path, call := range paths {
		for _, tc := range cases {
			name := path + "/" + tc.name
			t.Run(name, func(t *testing.T) {
				err := call(ctx, name, tc.fn, name)
				if (err != nil) != tc.err {
					t.Fatalf("err %v, want an error: %v", err, tc.err)
				}
				var n int
				if err := pool.QueryRow(ctx, "select count(*) from river_job where args->>'case' = $1", name).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != tc.jobs {
					t.Fatalf("%d jobs committed, want %d", n, tc.jobs)
				}
				// The key's outcome agrees: stored on success and refusal.
				_, lookupErr := keys.Lookup(ctx, "", name)
				stored := !errors.Is(lookupErr, idem.ErrNotFound)
				if want := tc.name != "fn fails"; stored != want {
					t.Fatalf("key stored %v (%v), want %v", stored, lookupErr, want)
				}
			})
		}
	}
}

// run runs fn through idem.Run on db under key.
func run(ctx context.Context, db idem.Beginner, key string, fn func(context.Context, pgx.Tx, string) error, c string) error {
	_, _, err := idem.Run(ctx, db, key, "h", func(ctx context.Context, tx pgx.Tx) (string, error) {
		if err := fn(ctx, tx, c); err != nil {
			return "", err
		}
		return fmt.Sprint("done ", c), nil
	})
	return err
}
