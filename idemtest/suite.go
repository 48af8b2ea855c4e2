package idemtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/kit"
)

// DefaultRetries is how many retries follow a first call when
// Suite.Retries is not set.
const DefaultRetries = 3

// DefaultConcurrency is how many duplicates the Concurrent scenario makes at
// once when Suite.Concurrency is not set.
const DefaultConcurrency = 32

// Suite describes the operation under test: how the application calls it,
// with what request, and how to count its effect. Call, DB and Effects are
// required; every other field has a default. Run runs the battery.
type Suite[Req, Resp any] struct {
	// Call is the operation as the application calls it, with the
	// idempotency key: the function idem.Wrap returns, or a function that
	// hashes req and calls idem.Run. Give it exactly what the
	// application runs (its Client, its options, its scope: a Call that
	// adds the scope to ctx with idem.ContextWithScope, say). It is called
	// from many goroutines at once and must not modify req.
	Call func(ctx context.Context, key string, req Req) (Resp, idem.Outcome, error)

	// DB is the database Call uses: the kit looks for the keys it sent and
	// for traces of rolled-back attempts there, and makes attempts fail
	// there (see Suite.Run). A *pgxpool.Pool, or the *idem.Client that Call
	// uses. It must stay open until t ends, not only until Run returns: the
	// kit cleans up (its trigger, its keys) when t ends, after the test
	// function returned, so close a pool with t.Cleanup(pool.Close),
	// registered before Run, never with defer.
	DB idem.Beginner

	// Table is the key table when DB is not an *idem.Client. Defaults to
	// idem.DefaultTable.
	Table string

	// Request is the request under test. Call must accept it and succeed.
	Request Req

	// NewRequest, if set, returns the request for each scenario in place of
	// Request: an operation that refuses a second use of one business
	// object (an order that can be paid once) needs an object of its own
	// per scenario. The kit calls it once as each scenario starts, with the
	// scenario's t (create the object there), and every call of that
	// scenario sends what it returned.
	NewRequest func(t testing.TB) Req

	// Change returns a request that differs from req in what the request
	// hash covers: the kit calls with it under a used key and expects
	// idem.ErrMismatch. Defaults to req with one value of its JSON form
	// changed: the first number, string or boolean, depth first, with
	// object members in key order (a number gains 1, a string gets
	// "-changed" appended, a boolean flips), decoded back into a Req.
	Change func(req Req) Req

	// Effects counts the effects of the operation in DB: the charges
	// inserted, say (select count(*) from charges where account = ...). The
	// kit reads it before and after each scenario and checks that each
	// scenario added exactly as many as it should have executed. Count
	// every call's effect, and only this suite's: a concurrent writer
	// (another test on the same database) makes the counts meaningless.
	Effects func(ctx context.Context) (int, error)

	// Check, if set, runs after each scenario that completed, with the
	// scenario's own t and what it did: assert the operation's other
	// invariants there (the balance equals the initial balance minus the
	// amount times s.TotalExecutions, say).
	Check func(t testing.TB, s Scenario)

	// IgnoreTables lists tables that the kit does not watch for changes
	// when a rolled-back attempt or a replay must change nothing: tables
	// written outside the operation's transaction on purpose, or by other
	// tests at the same time, or too large to read after every scenario.
	// The key table and sequences are never watched.
	IgnoreTables []string

	// Retries is how many retries follow a first call. Defaults to
	// DefaultRetries.
	Retries int

	// Concurrency is how many duplicates the Concurrent scenario makes at
	// once. Defaults to DefaultConcurrency; at least 2.
	Concurrency int
}

// Scenario tells Check what a scenario did.
type Scenario struct {
	// Name is the scenario's name, as its subtest is named.
	Name string
	// Keys are the idempotency keys the scenario used.
	Keys []string
	// Executions is how many times the operation should have taken effect
	// in this scenario: 1, or 0 when its only attempt was made to fail.
	Executions int
	// TotalExecutions is Executions summed over this scenario and those
	// that ran before it in this Run.
	TotalExecutions int
}

// Result is what one scenario reported, for Results.
type Result struct {
	// Scenario is the scenario's name.
	Scenario string
	// Failures are the scenario's failure messages; none if it passed.
	Failures []string
	// Skipped reports whether Check skipped the scenario.
	Skipped bool
}

// Passed reports whether the scenario passed.
func (r Result) Passed() bool { return len(r.Failures) == 0 }

// Run runs the battery in t, each scenario as a subtest, in this order:
//
//   - Retries: a first call, then Retries retries with the same key. Every
//     retry returns a result equal to the first (reflect.DeepEqual) and no
//     error; the operation took effect once (Effects), and the retries
//     changed no table.
//   - LostAnswer: a call whose result the kit drops, then retries: they
//     return one result, the operation took effect once, and the retries
//     changed no table.
//   - Concurrent: Concurrency duplicate calls at once: each returns the
//     one result or an error wrapping idem.ErrInProgress, and the
//     operation took effect once.
//   - ChangedRequest: a call, then one with a request changed by Change
//     and the same key: it fails with idem.ErrMismatch, without effect;
//     the original still returns the first result.
//   - FailureNotStored: a call made to fail after its work ran returns an
//     error and leaves the key free; the retry executes, once.
//   - WritesInTransaction: a call made to fail after its work ran leaves no
//     effect and changes no table. An operation that writes through the
//     pool (or a transaction of its own) instead of the transaction idem
//     gives it fails here: its writes survive the rollback.
//
// To make a call fail after its work ran, the kit creates a trigger on the
// key table that fails the armed key's completion, just before COMMIT: the
// work runs, then its transaction rolls back and the call returns the
// trigger's error. The trigger, its function and its table
// (idemtest_fault_<random>, in the key table's schema) are dropped when t
// ends; this needs the right to create them.
//
// To tell a rolled-back attempt from one that left traces, the kit also
// compares a digest of every table's rows (except the key table,
// IgnoreTables and sequences) before and after it, and reports the tables
// that changed.
//
// Check runs after each scenario. Scenarios use keys of their own and run
// one after another; their effects add up (TotalExecutions). When t ends,
// the kit deletes the keys it used if t passed, and keeps them for
// inspection otherwise; the operation's effects stay. An invalid Suite
// fails t at once.
//
// When t is not a *testing.T (a *testing.B, say), the scenarios run one
// after another on t itself, their failures prefixed with their names.
func (s Suite[Req, Resp]) Run(t testing.TB) {
	t.Helper()
	scenarios, err := s.setup(t)
	if err != nil {
		t.Fatalf("idemtest: %v", err)
	}
	kit.Run(t, scenarios)
}

// Results runs the battery outside a test, as Run does in one, and returns
// what each scenario reported; it cleans up before it returns. It is for
// programs and for examples: in a test, use Run. The error reports an
// invalid Suite or a database that cannot be reached (with no results), or
// a failed clean-up (with them).
func (s Suite[Req, Resp]) Results(ctx context.Context) ([]Result, error) {
	var (
		results []Result
		err     error
	)
	r := kit.NewRecorder(ctx, "idemtest")
	r.Go(func(t testing.TB) {
		var scenarios []kit.Scenario
		scenarios, err = s.setup(t)
		if err != nil {
			return
		}
		for _, res := range kit.Results(t.Context(), t.Name(), scenarios) {
			results = append(results, Result(res))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("idemtest: %w", err)
	}
	if f := r.Failures(); len(f) > 0 {
		return results, fmt.Errorf("idemtest: %s", strings.Join(f, "; "))
	}
	return results, nil
}

// setup checks s and returns the scenarios of a run on t.
func (s Suite[Req, Resp]) setup(t testing.TB) ([]kit.Scenario, error) {
	switch {
	case s.Call == nil:
		return nil, errors.New("Suite needs Call: the operation as the application calls it")
	case s.Effects == nil:
		return nil, errors.New("Suite needs Effects: the count of the operation's effects in the database")
	case s.Retries < 0:
		return nil, fmt.Errorf("invalid Suite: Retries %d is negative", s.Retries)
	case s.Concurrency < 0 || s.Concurrency == 1:
		return nil, fmt.Errorf("invalid Suite: Concurrency %d, want at least 2", s.Concurrency)
	}
	if s.Retries == 0 {
		s.Retries = DefaultRetries
	}
	if s.Concurrency == 0 {
		s.Concurrency = DefaultConcurrency
	}
	db, err := kit.OpenDB(t.Context(), s.DB, s.Table, s.IgnoreTables)
	if err != nil {
		return nil, err
	}
	r := &run[Req, Resp]{suite: s, session: kit.NewSession(t, db, s.Effects)}
	return []kit.Scenario{
		{Name: "Retries", Run: r.with(r.retries)},
		{Name: "LostAnswer", Run: r.with(r.lostAnswer)},
		{Name: "Concurrent", Run: r.with(r.concurrent)},
		{Name: "ChangedRequest", Run: r.with(r.changedRequest)},
		{Name: "FailureNotStored", Run: r.with(r.failureNotStored)},
		{Name: "WritesInTransaction", Run: r.with(r.writesInTransaction)},
	}, nil
}
