package idemtest_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemtest"
)

type ChargeRequest struct {
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

type Charge struct {
	ID     int64 `json:"id"`
	Amount int   `json:"amount"`
}

// Charges is a service whose Charge method runs in the transaction it is
// given.
type Charges struct{}

func (Charges) Charge(ctx context.Context, tx pgx.Tx, req ChargeRequest) (Charge, error) {
	c := Charge{Amount: req.Amount}
	err := tx.QueryRow(ctx, "insert into example_charges (account, amount) values ($1, $2) returning id",
		req.Account, req.Amount).Scan(&c.ID)
	return c, err
}

// A service method made idempotent with idem.Wrap is proved exactly-once.
// In a test, the last lines are suite.Run(t): each scenario becomes a
// subtest. Outside a test, as here, Results runs the same scenarios and
// says how each went.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // a database with idem's schema
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `create table example_charges (
		id bigserial primary key, account text not null, amount int not null)`); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `drop table example_charges`)

	suite := idemtest.Suite[ChargeRequest, Charge]{
		Call:    idem.Wrap(pool, "charges.create", Charges{}.Charge), // as the application calls it
		DB:      pool,
		Request: ChargeRequest{Account: "acct-1", Amount: 500},
		Effects: func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, "select count(*) from example_charges").Scan(&n)
			return n, err
		},
		Check: func(t testing.TB, s idemtest.Scenario) {
			var total int
			if err := pool.QueryRow(t.Context(), "select coalesce(sum(amount), 0) from example_charges").Scan(&total); err != nil {
				t.Fatal(err)
			}
			if want := 500 * s.TotalExecutions; total != want {
				t.Errorf("charged %d in all, want %d", total, want)
			}
		},
	}
	results, err := suite.Results(ctx) // in a test: suite.Run(t)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range results {
		fmt.Println(r.Scenario, r.Passed(), r.Failures)
	}
	// Output:
	// Retries true []
	// LostAnswer true []
	// Concurrent true []
	// ChangedRequest true []
	// FailureNotStored true []
	// WritesInTransaction true []
}
