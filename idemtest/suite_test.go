package idemtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/testkit/testdb"
)

type chargeRequest struct {
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

type charge struct {
	ID       int64     `json:"id"`
	Amount   int       `json:"amount"`
	ServedAt time.Time `json:"served_at,omitzero"`
}

// store holds charges; charge is the operation under test.
type store struct {
	pool       *pgxpool.Pool
	poolWrites bool // the defect: writes through the pool, not tx
}

func newStore(t *testing.T) *store {
	t.Helper()
	s := &store{pool: testdb.New(t)}
	if _, err := s.pool.Exec(t.Context(), `create table charges (id bigserial primary key, account text not null, amount int not null)`); err != nil {
		t.Fatal(err)
	}
	return s
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *store) charge(ctx context.Context, tx pgx.Tx, req chargeRequest) (charge, error) {
	var db querier = tx
	if s.poolWrites {
		db = s.pool
	}
	c := charge{Amount: req.Amount}
	err := db.QueryRow(ctx, "insert into charges (account, amount) values ($1, $2) returning id", req.Account, req.Amount).Scan(&c.ID)
	return c, err
}

func (s *store) effects(ctx context.Context) (n int, err error) {
	err = s.pool.QueryRow(ctx, "select count(*) from charges").Scan(&n)
	return n, err
}

func (s *store) suite(call func(ctx context.Context, key string, req chargeRequest) (charge, idem.Outcome, error)) idemtest.Suite[chargeRequest, charge] {
	return idemtest.Suite[chargeRequest, charge]{
		Call:    call,
		DB:      s.pool,
		Request: chargeRequest{Account: "acct-1", Amount: 500},
		Effects: s.effects,
	}
}

var scenarios = []string{"Retries", "LostAnswer", "Concurrent", "ChangedRequest", "FailureNotStored", "WritesInTransaction"}

// An operation run through idem.Wrap passes, and the kit leaves nothing
// behind.
func TestWrapPasses(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	suite := s.suite(idem.Wrap(s.pool, "charges.create", s.charge))
	var names []string
	suite.Check = func(t testing.TB, sc idemtest.Scenario) {
		names = append(names, sc.Name)
		n, err := s.effects(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n != sc.TotalExecutions {
			t.Errorf("after %s: %d charges, want TotalExecutions %d", sc.Name, n, sc.TotalExecutions)
		}
	}
	t.Run("kit", func(t *testing.T) { suite.Run(t) })
	if strings.Join(names, " ") != strings.Join(scenarios, " ") {
		t.Errorf("Check ran after %v, want %v", names, scenarios)
	}
	if objects, keys := kitObjects(t, s.pool, "idempotency_keys"); objects != 0 || keys != 0 {
		t.Errorf("after a passing run: %d kit objects and %d keys left, want none", objects, keys)
	}
}

// A closure over idem.Run on an *idem.Client with a table of its own and a
// scope in the context passes.
func TestRunOnClientPasses(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	if _, err := s.pool.Exec(t.Context(), `create schema billing;
		create table billing.keys (like idempotency_keys including all)`); err != nil {
		t.Fatal(err)
	}
	keys, err := idem.NewClient(s.pool, &idem.Config{Table: "billing.keys"})
	if err != nil {
		t.Fatal(err)
	}
	suite := s.suite(func(ctx context.Context, key string, req chargeRequest) (charge, idem.Outcome, error) {
		hash, err := idem.HashJSON(req)
		if err != nil {
			return charge{}, idem.OutcomeInvalid, err
		}
		ctx = idem.ContextWithScope(ctx, "tenant-7")
		return idem.Run(ctx, keys, key, hash, func(ctx context.Context, tx pgx.Tx) (charge, error) { return s.charge(ctx, tx, req) })
	})
	suite.DB = keys
	suite.Concurrency = 8
	t.Run("kit", func(t *testing.T) { suite.Run(t) })
	if objects, n := kitObjects(t, s.pool, "billing.keys"); objects != 0 || n != 0 {
		t.Errorf("after a passing run: %d kit objects and %d keys left, want none", objects, n)
	}
}

// Each defect fails the scenario that names it, with a message that says
// what is wrong.
func TestDefectsFailTheKit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		call     func(s *store) func(ctx context.Context, key string, req chargeRequest) (charge, idem.Outcome, error)
		scenario string
		want     string
		passes   []string
	}{
		{
			name: "writes through the pool",
			call: func(s *store) func(context.Context, string, chargeRequest) (charge, idem.Outcome, error) {
				s.poolWrites = true
				return idem.Wrap(s.pool, "charges.create", s.charge)
			},
			scenario: "WritesInTransaction",
			want:     "the operation writes outside the transaction idem gives it",
			passes:   []string{"Retries", "LostAnswer", "Concurrent", "ChangedRequest", "FailureNotStored"},
		},
		{
			name: "no idem: every retry runs again",
			call: func(s *store) func(context.Context, string, chargeRequest) (charge, idem.Outcome, error) {
				return func(ctx context.Context, key string, req chargeRequest) (charge, idem.Outcome, error) {
					var c charge
					err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) (err error) {
						c, err = s.charge(ctx, tx, req)
						return err
					})
					return c, idem.OutcomeExecuted, err
				}
			},
			scenario: "Retries",
			want:     "Call runs the operation again for a used key",
		},
		{
			name: "request hash ignores the request",
			call: func(s *store) func(context.Context, string, chargeRequest) (charge, idem.Outcome, error) {
				return func(ctx context.Context, key string, req chargeRequest) (charge, idem.Outcome, error) {
					return idem.Run(ctx, s.pool, key, "same-for-all", func(ctx context.Context, tx pgx.Tx) (charge, error) { return s.charge(ctx, tx, req) })
				}
			},
			scenario: "ChangedRequest",
			want:     "the request hash that Call gives idem does not cover what changed",
			passes:   []string{"Retries", "LostAnswer", "Concurrent", "FailureNotStored", "WritesInTransaction"},
		},
		{
			name: "result changed after idem returns it",
			call: func(s *store) func(context.Context, string, chargeRequest) (charge, idem.Outcome, error) {
				wrapped := idem.Wrap(s.pool, "charges.create", s.charge)
				return func(ctx context.Context, key string, req chargeRequest) (charge, idem.Outcome, error) {
					c, outcome, err := wrapped(ctx, key, req)
					c.ServedAt = time.Now()
					return c, outcome, err
				}
			},
			scenario: "Retries",
			want:     "a replay must return the first result exactly",
			passes:   []string{"FailureNotStored", "WritesInTransaction"},
		},
		{
			name: "errors dropped",
			call: func(s *store) func(context.Context, string, chargeRequest) (charge, idem.Outcome, error) {
				wrapped := idem.Wrap(s.pool, "charges.create", s.charge)
				return func(ctx context.Context, key string, req chargeRequest) (charge, idem.Outcome, error) {
					c, outcome, err := wrapped(ctx, key, req)
					if err != nil && !errIsIdem(err) {
						return charge{}, idem.OutcomeExecuted, nil
					}
					return c, outcome, err
				}
			},
			scenario: "FailureNotStored",
			want:     "returned no error",
			passes:   []string{"Retries", "LostAnswer", "Concurrent", "ChangedRequest"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			res, err := s.suite(tc.call(s)).Results(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			failures := map[string][]string{}
			for _, r := range res {
				failures[r.Scenario] = r.Failures
				for _, f := range r.Failures {
					t.Logf("%s: %s", r.Scenario, f)
				}
			}
			if !contains(failures[tc.scenario], tc.want) {
				t.Errorf("%s: failures %q, want one containing %q", tc.scenario, failures[tc.scenario], tc.want)
			}
			for _, name := range tc.passes {
				if len(failures[name]) > 0 {
					t.Errorf("%s failed, want it to pass with this defect: %q", name, failures[name])
				}
			}
		})
	}
}

// errIsIdem reports errors that idem itself returns before any work (a key
// in progress, a mismatch): the defect only drops the others.
func errIsIdem(err error) bool {
	return errors.Is(err, idem.ErrInProgress) || errors.Is(err, idem.ErrMismatch)
}

func contains(msgs []string, want string) bool {
	for _, m := range msgs {
		if strings.Contains(m, want) {
			return true
		}
	}
	return false
}

// kitObjects counts what the kit leaves in the database: its fault's
// tables, functions and triggers, and the keys in table.
func kitObjects(t *testing.T, pool *pgxpool.Pool, table string) (objects, keys int) {
	t.Helper()
	err := pool.QueryRow(t.Context(), `select
		(select count(*) from pg_class where relname like 'idemtest\_%')
		+ (select count(*) from pg_proc where proname like 'idemtest\_%')
		+ (select count(*) from pg_trigger where tgname like 'idemtest\_%'),
		(select count(*) from `+table+`)`).Scan(&objects, &keys)
	if err != nil {
		t.Fatal(err)
	}
	return objects, keys
}

// An operation that refuses a second use of one business object (an order
// paid once) passes with a request of its own per scenario (NewRequest);
// with one Request for every scenario, all but the first fail.
func TestNewRequestPerScenario(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	if _, err := s.pool.Exec(t.Context(), `create unique index charges_once on charges (account)`); err != nil {
		t.Fatal(err)
	}
	pay := idem.Wrap(s.pool, "orders.pay", s.charge)
	fixed := s.suite(pay)
	results, err := fixed.Results(t.Context())
	if err != nil && len(results) == 0 {
		t.Fatal(err)
	}
	failed := 0
	for _, r := range results {
		if !r.Passed() {
			failed++
		}
	}
	if failed == 0 {
		t.Fatal("one order for every scenario: no scenario failed, want the second use of the order refused")
	}

	n := 0
	perScenario := s.suite(pay)
	perScenario.NewRequest = func(t testing.TB) chargeRequest {
		n++
		return chargeRequest{Account: fmt.Sprintf("order-%d", n), Amount: 500}
	}
	t.Run("kit", func(t *testing.T) { perScenario.Run(t) })
	if n != len(scenarios) {
		t.Errorf("NewRequest called %d times, want once per scenario (%d)", n, len(scenarios))
	}
}
