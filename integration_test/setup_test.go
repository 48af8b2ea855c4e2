package integration_test

import (
	"context"
	"hash/fnv"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/schema"
	"github.com/idemhq/idem/testkit/testdb"
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
//
// make test runs three of the six, one per protocol of tx.go: plain/pool
// or plain/conn (the key's row written at completion), plain/outer_tx (the
// row inserted at the claim, in a savepoint), and partitioned with one of
// the three handles (inserted at the claim), the handles chosen from the
// test's name (shortVariants) so that the tests together run all six. Each
// database is a CREATE DATABASE, which costs the server more than most
// tests' work. With IDEM_TEST_LONG=1 it runs all six: make test-long runs
// the tests of variantTests so, through TestVariantsLong.
func forEachVariant(t *testing.T, body func(t *testing.T, s *setup, v variant)) {
	t.Helper()
	name, _, _ := strings.Cut(strings.TrimPrefix(t.Name(), "TestVariantsLong/"), "/")
	if _, ok := variantTests[name]; !ok {
		t.Fatalf("%s calls forEachVariant: add it to variantTests (setup_test.go), so that make test-long runs all its variants", name)
	}
	all := os.Getenv("IDEM_TEST_LONG") == "1"
	short := shortVariants(name)
	for li, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			for vi, v := range variants {
				if !all && !short[li][vi] {
					continue
				}
				t.Run(v.name, func(t *testing.T) {
					t.Parallel()
					body(t, newSetupLayout(t, l), v)
				})
			}
		})
	}
}

// shortVariants returns, by layout and variant, the variants make test runs
// the test called name with (see forEachVariant): on the plain layout the
// pool or the connection, picked by a hash of the name, and the outer
// transaction; on the partitioned layout one of the three, picked by the
// same hash.
func shortVariants(name string) [2][3]bool {
	h := fnv.New32a()
	h.Write([]byte(name))
	p := int(h.Sum32() % 6)
	var short [2][3]bool
	short[0][p%2] = true // pool or conn
	short[0][2] = true   // outer_tx
	short[1][p/2] = true
	return short
}

// variantTests are the tests that call forEachVariant, which TestVariantsLong
// runs over all six variants. It is filled in init: as a variable's
// initializer it would be a cycle (the tests call forEachVariant, which
// reads it).
var variantTests map[string]func(*testing.T)

func init() {
	variantTests = map[string]func(*testing.T){
		"TestClaimRaceCommitAfterSnapshot":     TestClaimRaceCommitAfterSnapshot,
		"TestCommitFailureRollsBackKeyAndWork": TestCommitFailureRollsBackKeyAndWork,
		"TestCommittedInProgressRowIsReplaced": TestCommittedInProgressRowIsReplaced,
		"TestErrorsThatHelp":                   TestErrorsThatHelp,
		"TestExpiry":                           TestExpiry,
		"TestExternalCallWithDerivedKey":       TestExternalCallWithDerivedKey,
		"TestFailuresAreNotStored":             TestFailuresAreNotStored,
		"TestHostileBodyChangesBetweenRetries": TestHostileBodyChangesBetweenRetries,
		"TestHostileKeysRoundTrip":             TestHostileKeysRoundTrip,
		"TestInProgressAnswersAtOnce":          TestInProgressAnswersAtOnce,
		"TestLargeObjectsInFn":                 TestLargeObjectsInFn,
		"TestLargeResult":                      TestLargeResult,
		"TestMismatch":                         TestMismatch,
		"TestOneTransaction":                   TestOneTransaction,
		"TestRefusalIsStoredAndReplayed":       TestRefusalIsStoredAndReplayed,
		"TestRefusalTextJSONBCannotHold":       TestRefusalTextJSONBCannotHold,
		"TestReplay":                           TestReplay,
		"TestScopes":                           TestScopes,
		"TestTransactionHandedToFn":            TestTransactionHandedToFn,
	}
}

// TestVariantsLong runs every test that calls forEachVariant over the six
// layout × handle variants, of which make test runs three.
func TestVariantsLong(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("every layout × handle variant of the contract tests: make test-long runs it (IDEM_TEST_LONG=1)")
	}
	for _, name := range slices.Sorted(maps.Keys(variantTests)) {
		t.Run(name, variantTests[name])
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

// client is db, or the Client of the test's pool with s.cfg, on db, when
// the test set one.
func (s *setup) client(db idem.Beginner) idem.Beginner {
	if s.cfg == nil {
		return db
	}
	c, err := idem.NewClient(s.pool, s.cfg)
	if err != nil {
		s.t.Fatalf("NewClient: %v", err)
	}
	return c.On(db)
}
