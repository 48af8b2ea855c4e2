package integration_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// directPool returns a pool straight to the ledger's database.
func (l *ledger) directPool(configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	l.t.Helper()
	return l.newPool(l.url, configure...)
}

// holdAccount locks the row of account in a transaction of its own, so
// fn's balance update waits; release ends that transaction. The lock lets
// the foreign key check of fn's insert through (it takes KEY SHARE).
func (l *ledger) holdAccount(account int64) (release func()) {
	l.t.Helper()
	ctx := context.Background()
	tx, err := l.admin.Begin(ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select 1 from accounts where id = $1 for no key update", account); err != nil {
		l.t.Fatal(err)
	}
	return func() { _ = tx.Rollback(ctx) }
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestFaultTerminateBackend (f): an administrator terminates the backend
// that runs fn, between fn's two statements.
func TestFaultTerminateBackend(t *testing.T) {
	for _, path := range []string{"pool", "conn"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			l := newLedger(t)
			ctx := context.Background()
			const key, account, amount = "k-terminate", 1, 100
			var db idem.Beginner = l.directPool()
			retryDB := db
			if path == "conn" {
				conn, err := pgx.Connect(ctx, l.url)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(ctx)
				db, retryDB = conn, l.admin
			}
			var runs atomic.Int64
			work := chargeWork(ctx, key, account, amount, &runs)
			_, err := idem.Do(ctx, db, key, ledgerHash, func(tx pgx.Tx) (receipt, error) {
				var r receipt
				if err := tx.QueryRow(ctx,
					"insert into charges (account_id, amount, idem_key) values ($1, $2, $3) returning id",
					account, amount, key).Scan(&r.ChargeID); err != nil {
					return r, err
				}
				var pid uint32
				if err := tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
					return r, err
				}
				// The timeout makes pg_terminate_backend wait until the
				// backend is gone.
				var gone bool
				if err := l.admin.QueryRow(ctx, "select pg_terminate_backend($1, 30000)", pid).Scan(&gone); err != nil || !gone {
					t.Errorf("pg_terminate_backend: %v, %v", gone, err)
				}
				err := tx.QueryRow(ctx,
					"update accounts set balance = balance + $2 where id = $1 returning balance",
					account, amount).Scan(&r.Balance)
				return r, err
			})
			definite(t, err)
			if !idem.Retryable(err) {
				t.Fatalf("%v (SQLSTATE %q): a terminated backend must be retryable", err, pgCode(err))
			}
			l.noTrace(key)
			again, calls, replayed := retryKey(t, retryDB, key, work)
			if replayed || runs.Load() != 1 {
				t.Fatalf("replayed %v, fn ran %d times on retry; want a fresh run", replayed, runs.Load())
			}
			l.exactlyOnce(key, account, amount, again)
			t.Logf("terminated: %v (SQLSTATE %q); settled after %d calls", err, pgCode(err), calls)
		})
	}
}

// TestFaultTimeouts (g): a timeout fires inside fn while its balance update
// waits for a row lock that another session holds.
func TestFaultTimeouts(t *testing.T) {
	for _, c := range []struct {
		name      string
		set       string // run inside fn before the update
		database  string // set on the database before connecting
		code      string
		retryable bool
	}{
		{name: "statement_timeout_set_local", set: "set local statement_timeout = '100ms'", code: pgerrcode.QueryCanceled},
		{name: "statement_timeout_database", database: "statement_timeout = '100ms'", code: pgerrcode.QueryCanceled},
		{name: "lock_timeout_set_local", set: "set local lock_timeout = '100ms'", code: pgerrcode.LockNotAvailable, retryable: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := newLedger(t)
			ctx := context.Background()
			const key, account, amount = "k-timeout", 1, 100
			if c.database != "" {
				var db string
				if err := l.admin.QueryRow(ctx, "select current_database()").Scan(&db); err != nil {
					t.Fatal(err)
				}
				if _, err := l.admin.Exec(ctx, "alter database "+pgx.Identifier{db}.Sanitize()+" set "+c.database); err != nil {
					t.Fatal(err)
				}
			}
			pool := l.directPool()
			release := l.holdAccount(account)
			work := chargeWork(ctx, key, account, amount, nil)
			_, err := idem.Do(ctx, pool, key, ledgerHash, func(tx pgx.Tx) (receipt, error) {
				if c.set != "" {
					if _, err := tx.Exec(ctx, c.set); err != nil {
						return receipt{}, err
					}
				}
				return work(tx)
			})
			release()
			definite(t, err)
			if pgCode(err) != c.code || idem.Retryable(err) != c.retryable {
				t.Fatalf("got %v (SQLSTATE %q, retryable %v); want SQLSTATE %s, retryable %v",
					err, pgCode(err), idem.Retryable(err), c.code, c.retryable)
			}
			l.noTrace(key)
			again, calls, replayed := retryKey(t, pool, key, work)
			if replayed {
				t.Fatal("the retry replayed a call that rolled back")
			}
			l.exactlyOnce(key, account, amount, again)
			t.Logf("%s: %v; settled after %d calls", c.name, err, calls)
		})
	}
}

// TestFaultPoolExhausted (h): the pool's only connection is held elsewhere
// and the call's deadline passes while it waits to acquire one.
func TestFaultPoolExhausted(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	const key, account, amount = "k-exhausted", 1, 100
	pool := l.directPool(func(c *pgxpool.Config) { c.MaxConns = 1 })
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	work := chargeWork(ctx, key, account, amount, &runs)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = idem.Do(short, pool, key, ledgerHash, work)
	cancel()
	held.Release()
	definite(t, err)
	if !errors.Is(err, context.DeadlineExceeded) || !idem.Retryable(err) {
		t.Fatalf("got %v (retryable %v); want the deadline, retryable", err, idem.Retryable(err))
	}
	if runs.Load() != 0 {
		t.Fatal("fn ran without a connection")
	}
	l.noTrace(key)
	again, calls, replayed := retryKey(t, pool, key, work)
	if replayed {
		t.Fatal("the retry replayed a call that never ran")
	}
	l.exactlyOnce(key, account, amount, again)
	t.Logf("exhausted: %v; settled after %d calls", err, calls)
}
