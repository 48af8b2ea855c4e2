package idemhttptest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/testkit/kit"
)

// DefaultRetries is how many retries follow a first request when
// Suite.Retries is not set: idemtest's.
const DefaultRetries = idemtest.DefaultRetries

// DefaultConcurrency is how many duplicates the Concurrent scenario sends at
// once when Suite.Concurrency is not set: idemtest's.
const DefaultConcurrency = idemtest.DefaultConcurrency

// Suite describes the endpoint under test: the service, the request, and how
// to count its effect. Handler or URL, DB, Request and Effects are required;
// every other field has a default. Run runs the battery.
type Suite struct {
	// Handler is the service's handler as it is served: the whole stack,
	// with idemhttp's middleware where the service puts it, and the
	// authentication and routing around it. The kit serves it with
	// net/http/httptest. Set Handler or URL, not both.
	Handler http.Handler

	// URL is the base URL of a running service ("http://127.0.0.1:8080"),
	// for a service started by other means. Its path, if any, prefixes the
	// path of every request. The service must use DB.
	URL string

	// Client sends the requests: one whose transport signs requests, say.
	// Defaults to the test server's client with Handler, and to a client of
	// the kit's own with URL.
	Client *http.Client

	// DB is the database the service uses: the kit looks for the keys it
	// sent and for traces of rolled-back attempts there, and, unless Faults
	// is set, makes attempts fail there (see Suite.Run). A *pgxpool.Pool, or
	// the *idem.Client the service was given. It must stay open until t
	// ends, not only until Run returns: the kit cleans up when t ends, after
	// the test function returned, so close a pool with
	// t.Cleanup(pool.Close), registered before Run, never with defer.
	DB idem.Beginner

	// Table is the key table when DB is not an *idem.Client. Defaults to
	// idem.DefaultTable.
	Table string

	// Request returns the request under test, without an Idempotency-Key:
	// the kit sets one per scenario. It is called once per request sent,
	// always from the test's goroutine, and must return the same request
	// each time (per-request headers such as a signed Authorization are
	// fine). A URL without a host (http.NewRequest("POST", "/charges",
	// body)) is sent to the Handler or to URL; requests built with
	// httptest.NewRequest work too. The handler must accept it and answer
	// 2xx.
	Request func(t testing.TB) *http.Request

	// Change returns a request that differs from r, a request from Request,
	// in what the service's fingerprint covers: the kit sends it with a used
	// key and expects 422. Defaults to r with one value of its JSON body
	// changed: the first number, string or boolean, depth first, with object
	// members in key order (a number gains 1, a string gets "-changed"
	// appended, a boolean flips). A body that is not JSON gets a byte
	// appended; without a body, set Change.
	Change func(t testing.TB, r *http.Request) *http.Request

	// Effects counts the effects of the operation in DB: the charges
	// inserted, say (select count(*) from charges where account = ...). The
	// kit reads it before and after each scenario and checks that each
	// scenario added exactly as many as it should have executed. Count
	// every request's effect, and only this suite's: a concurrent writer
	// (another test on the same database) makes the counts meaningless.
	Effects func(ctx context.Context) (int, error)

	// Check, if set, runs after each scenario that completed, with the
	// scenario's own t and what it did: assert the service's other
	// invariants there (the balance equals the initial balance minus the
	// amount times s.TotalExecutions, say).
	Check func(t testing.TB, s Scenario)

	// Faults, if set, is installed in the service's handler stack, inside
	// idemhttp's middleware: the kit then makes attempts fail through it,
	// with a 503 the handler's stack answers after the handler ran, which
	// also checks that the service does not store 5xx answers. Without it,
	// the kit makes attempts fail in the database (see Suite.Run).
	Faults *Faults

	// IgnoreTables lists tables that the kit does not watch for changes
	// when a rolled-back attempt or a replay must change nothing: tables
	// that are written outside the request's transaction on purpose (a
	// request log), or by other tests at the same time, or too large to
	// read after every scenario. The key table and sequences are never
	// watched.
	IgnoreTables []string

	// ReplayHeaders lists response headers, beyond those idemhttp always
	// replays (Content-Type, Location, ETag and the others of
	// idemhttp.Config.ReplayHeaders), that a replay must repeat: the
	// service's own idemhttp.Config.ReplayHeaders.
	ReplayHeaders []string

	// Retries is how many retries follow a first request. Defaults to
	// DefaultRetries.
	Retries int

	// Concurrency is how many duplicates the Concurrent scenario sends at
	// once. Defaults to DefaultConcurrency; at least 2.
	Concurrency int
}

// Scenario tells Check what a scenario did, as idemtest's Scenario does;
// its Keys are the Idempotency-Keys the scenario sent.
type Scenario = idemtest.Scenario

// Result is what one scenario reported, for Results: idemtest's Result.
type Result = idemtest.Result

// Run runs the battery in t, each scenario as a subtest, in this order:
//
//   - Retries: a first request, then Retries retries with the same key.
//     The first answer is 2xx and not marked as a replay; every retry gets
//     the same status, body bytes and replayed headers, with
//     Idempotent-Replayed: true; the operation took effect once (Effects),
//     and the retries changed no table.
//   - LostAnswer: a request whose answer is lost after the service
//     committed (the kit drops the connection when the first byte of the
//     answer arrives, without reading it), then a retry: it is a replay, the
//     operation took effect once, and the retry changed no table.
//   - Concurrent: Concurrency duplicates at once: one executes, the others
//     are answered 409 (in progress) or replay its answer; the operation
//     took effect once.
//   - ChangedRequest: a request, then one changed by Change with the same
//     key: refused with 422, without effect; the original still replays.
//   - FailureNotStored: an attempt made to fail after the handler ran is
//     answered 5xx and leaves the key free; the retry executes, once.
//   - WritesInTransaction: an attempt made to fail after the handler ran
//     leaves no effect and changes no table. A handler that writes through
//     the pool (or a transaction of its own) instead of idemhttp.Tx fails
//     here: its writes survive the rollback.
//
// The kit makes an attempt fail in one of two ways. With Faults, the
// handler runs, and Faults' middleware answers 503 in its place. Without,
// the kit creates a trigger on the key table that fails the armed key's
// completion, just before COMMIT: the handler runs, then its transaction
// rolls back and idemhttp answers 500 (the service logs that failure, which
// names the kit). The trigger, its function and its table
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
// the kit deletes the keys it sent if t passed, and keeps them for
// inspection otherwise; the operation's effects stay. An invalid Suite
// fails t at once.
//
// When t is not a *testing.T (a *testing.B, say), the scenarios run one
// after another on t itself, their failures prefixed with their names.
func (s Suite) Run(t testing.TB) {
	t.Helper()
	scenarios, err := s.setup(t)
	if err != nil {
		t.Fatalf("idemhttptest: %v", err)
	}
	kit.Run(t, scenarios)
}

// Results runs the battery outside a test, as Run does in one, and returns
// what each scenario reported; it cleans up before it returns. It is for
// programs (a smoke test against a staging service, say) and for examples:
// in a test, use Run. The error reports an invalid Suite or a database that
// cannot be reached (with no results), or a failed clean-up (with them).
func (s Suite) Results(ctx context.Context) ([]Result, error) {
	var (
		results []Result
		err     error
	)
	r := kit.NewRecorder(ctx, "idemhttptest")
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
		return nil, fmt.Errorf("idemhttptest: %w", err)
	}
	// What the run itself reported: a failed clean-up.
	if f := r.Failures(); len(f) > 0 {
		return results, fmt.Errorf("idemhttptest: %s", strings.Join(f, "; "))
	}
	return results, nil
}

// setup checks s, starts the test server if need be, and returns the
// scenarios of a run on t.
func (s Suite) setup(t testing.TB) ([]kit.Scenario, error) {
	switch {
	case s.Handler == nil && s.URL == "":
		return nil, errors.New("Suite needs a Handler or a URL")
	case s.Handler != nil && s.URL != "":
		return nil, errors.New("Suite takes a Handler or a URL, not both")
	case s.Request == nil:
		return nil, errors.New("Suite needs Request: the request under test")
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
	r := &run{suite: s, client: s.Client}
	if s.Handler != nil {
		srv := httptest.NewServer(s.Handler)
		t.Cleanup(srv.Close)
		s.URL = srv.URL
		if r.client == nil {
			r.client = srv.Client()
		}
	}
	if r.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		t.Cleanup(tr.CloseIdleConnections)
		r.client = &http.Client{Transport: tr}
	}
	base, err := url.Parse(s.URL)
	if err != nil || base.Scheme == "" || base.Host == "" {
		return nil, fmt.Errorf("URL %q: want an absolute http or https URL", s.URL)
	}
	r.base = base
	r.replay = replayHeaders(s.ReplayHeaders)
	r.session = kit.NewSession(t, db, s.Effects)
	return []kit.Scenario{
		{Name: "Retries", Run: r.retries},
		{Name: "LostAnswer", Run: r.lostAnswer},
		{Name: "Concurrent", Run: r.concurrent},
		{Name: "ChangedRequest", Run: r.changedRequest},
		{Name: "FailureNotStored", Run: r.failureNotStored},
		{Name: "WritesInTransaction", Run: r.writesInTransaction},
	}, nil
}
