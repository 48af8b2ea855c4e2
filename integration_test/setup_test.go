package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/internal/testdb"
	"github.com/idemhq/idem/schema"
)

// bank is the small business schema the contract tests charge against.
const bankSQL = `
CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
CREATE TABLE charges (
    id         bigserial PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES accounts (id),
    amount     bigint NOT NULL,
    -- deferred so a test can make COMMIT itself fail
    ref        text UNIQUE DEFERRABLE INITIALLY DEFERRED
);
INSERT INTO accounts VALUES (1, 1000000), (2, 1000000);
`

// setup is the per-test state: a fresh database with the bank schema, and a
// pool to observe it from outside the transactions under test.
type setup struct {
	t    *testing.T
	pool *pgxpool.Pool
	// cfg, when set, is the Config of the Client that do and run wrap each
	// variant's handle in.
	cfg *idem.Config
	// layout is the key table's layout.
	layout layout
}

func newSetup(t *testing.T, configure ...func(*pgxpool.Config)) *setup {
	t.Helper()
	return newSetupLayout(t, plain, configure...)
}

// newSetupLayout is newSetup with the key table in layout l.
func newSetupLayout(t *testing.T, l layout, configure ...func(*pgxpool.Config)) *setup {
	t.Helper()
	pool := testdb.New(t, configure...)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, bankSQL); err != nil {
		t.Fatal(err)
	}
	if l.apply != nil {
		if err := l.apply(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	return &setup{t: t, pool: pool, layout: l}
}

// A layout is a shape of the key table: the plain one the template
// database holds, or the partitioned one put in its place.
type layout struct {
	name  string
	apply func(ctx context.Context, pool *pgxpool.Pool) error
}

var (
	plain = layout{name: "plain"}
	// partitioned has one-second partitions, so that a test's keys land in
	// several partitions and, with no sweeper running, in the DEFAULT one.
	partitioned = layout{name: "partitioned", apply: func(ctx context.Context, pool *pgxpool.Pool) error {
		return replaceWithPartitioned(ctx, pool, "idempotency_keys", time.Second)
	}}
	layouts = []layout{plain, partitioned}
)

// replaceWithPartitioned drops the plain key table of a fresh test database
// and applies the partitioned layout in its place.
func replaceWithPartitioned(ctx context.Context, pool *pgxpool.Pool, table string, interval time.Duration) error {
	if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
		return err
	}
	return schema.ApplyPartitioned(ctx, pool, table, interval)
}

// count runs a count(*) query and returns the number.
func (s *setup) count(sql string, args ...any) int {
	s.t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (s *setup) charges() int { return s.count("SELECT count(*) FROM charges") }

func (s *setup) keys(status string) int {
	return s.count("SELECT count(*) FROM idempotency_keys WHERE status = $1", status)
}

// charge is the business result the tests store and replay.
type charge struct {
	ID      int64 `json:"id"`
	Amount  int64 `json:"amount"`
	Balance int64 `json:"balance"`
}

// chargeFn returns an fn that charges account 1 and counts its executions.
func chargeFn(ctx context.Context, amount int64, runs *int) func(pgx.Tx) (charge, error) {
	return func(tx pgx.Tx) (charge, error) {
		*runs++
		c := charge{Amount: amount}
		err := tx.QueryRow(ctx, "UPDATE accounts SET balance = balance - $1 WHERE id = 1 RETURNING balance", amount).Scan(&c.Balance)
		if err != nil {
			return c, err
		}
		err = tx.QueryRow(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, $1) RETURNING id", amount).Scan(&c.ID)
		return c, err
	}
}

// A variant is one kind of database handle Do is given. with runs f with a
// handle of that kind and makes its effects visible (for an outer
// transaction: commits it) before returning.
type variant struct {
	name string
	with func(t *testing.T, pool *pgxpool.Pool, f func(db idem.Beginner))
}

var variants = []variant{
	{"pool", func(t *testing.T, pool *pgxpool.Pool, f func(idem.Beginner)) { f(pool) }},
	{"conn", func(t *testing.T, pool *pgxpool.Pool, f func(idem.Beginner)) {
		ctx := context.Background()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		f(conn.Conn())
	}},
	{"outer_tx", func(t *testing.T, pool *pgxpool.Pool, f func(idem.Beginner)) {
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) // after Commit it is a no-op
		f(tx)
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("outer commit: %v", err)
		}
	}},
}

// forEachVariant runs body as a parallel subtest per variant and layout
// (plain/pool, ..., partitioned/outer_tx), each on its own database: the
// contract holds on both layouts of the key table.
func forEachVariant(t *testing.T, body func(t *testing.T, s *setup, v variant)) {
	t.Helper()
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			for _, v := range variants {
				t.Run(v.name, func(t *testing.T) {
					t.Parallel()
					body(t, newSetupLayout(t, l), v)
				})
			}
		})
	}
}

// do calls idem.Do through variant v and returns what it returned.
func do[T any](t *testing.T, s *setup, v variant, key, hash string, fn func(pgx.Tx) (T, error), opts ...idem.Option) (T, error) {
	t.Helper()
	var (
		res T
		err error
	)
	v.with(t, s.pool, func(db idem.Beginner) {
		res, err = idem.Do(context.Background(), s.client(db), key, hash, fn, opts...)
	})
	return res, err
}

// run calls idem.Run with ctx through variant v and returns what it
// returned: the result, how the call ended, and the error. fn has Do's
// shape, so that do and run take the same work.
func run[T any](ctx context.Context, t *testing.T, s *setup, v variant, key, hash string, fn func(pgx.Tx) (T, error), opts ...idem.Option) (T, idem.Outcome, error) {
	t.Helper()
	var (
		res     T
		outcome idem.Outcome
		err     error
	)
	v.with(t, s.pool, func(db idem.Beginner) {
		res, outcome, err = idem.Run(ctx, s.client(db), key, hash, func(_ context.Context, tx pgx.Tx) (T, error) { return fn(tx) }, opts...)
	})
	return res, outcome, err
}

// runReplayed calls idem.Run on db with fn and reports whether the answer
// was a replay.
func runReplayed[T any](ctx context.Context, db idem.Beginner, key, hash string, fn func(pgx.Tx) (T, error), opts ...idem.Option) (T, bool, error) {
	v, outcome, err := idem.Run(ctx, db, key, hash, func(_ context.Context, tx pgx.Tx) (T, error) { return fn(tx) }, opts...)
	return v, outcome == idem.OutcomeReplayed, err
}

// client is db, or a Client on db with s.cfg when the test set one.
func (s *setup) client(db idem.Beginner) idem.Beginner {
	if s.cfg == nil {
		return db
	}
	c, err := idem.NewClient(db, s.cfg)
	if err != nil {
		s.t.Fatalf("NewClient: %v", err)
	}
	return c
}
