package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/testkit/lincheck"
	"github.com/idemhq/idem/testkit/testdb"
)

// The linearizability check's run lengths. The short run is part of every
// test run; IDEM_LINEARIZABILITY=long runs several seeds for minutes each
// (IDEM_LINEARIZABILITY_DURATION, IDEM_LINEARIZABILITY_SEEDS).
const (
	linShortRun  = 10 * time.Second
	linLongRun   = 2 * time.Minute
	linLongSeeds = 3
)

// linSettings is the run the environment asks for.
type linSettings struct {
	duration time.Duration
	seeds    []uint64
}

func linSettingsFromEnv(t *testing.T) linSettings {
	t.Helper()
	s := linSettings{duration: linShortRun, seeds: []uint64{1}}
	switch mode := os.Getenv("IDEM_LINEARIZABILITY"); mode {
	case "", "short":
	case "long":
		s.duration = linLongRun
		s.seeds = nil
		for i := range linLongSeeds {
			s.seeds = append(s.seeds, uint64(i+1))
		}
	default:
		t.Fatalf("IDEM_LINEARIZABILITY=%q: want short or long", mode)
	}
	if d := os.Getenv("IDEM_LINEARIZABILITY_DURATION"); d != "" {
		v, err := time.ParseDuration(d)
		if err != nil || v <= 0 {
			t.Fatalf("IDEM_LINEARIZABILITY_DURATION=%q: want a positive duration", d)
		}
		s.duration = v
	}
	if list := os.Getenv("IDEM_LINEARIZABILITY_SEEDS"); list != "" {
		s.seeds = nil
		for _, f := range strings.Split(list, ",") {
			v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				t.Fatalf("IDEM_LINEARIZABILITY_SEEDS=%q: want comma-separated integers", list)
			}
			s.seeds = append(s.seeds, v)
		}
	}
	return s
}

// TestLinearizability checks idem.Do and idem.Run from outside, as Jepsen
// checks a database: concurrent clients call a sliding window of hot keys
// with every kind of call (refusals, failing fns, another request hash,
// short deadlines, every isolation level, WithWait, through a pool too small
// for them) while backends of the test database are terminated every 20 to
// 150 ms. Every call's history is checked as a write-once register per key
// (testkit/lincheck, with porcupine), and the database is reconciled with
// it: a call told "failed" must have committed nothing, since its caller may
// retry with a new key.
//
// On the plain layout, service instances call idem.Operation beside them,
// under faults of their own (linearizability_operations_test.go): a
// database step, an external step at a fake provider that honours the
// derived key, a second database step, with a 300 ms lease, retries by the
// same and other instances, completers' Resume calls, paused instances
// whose operations are taken over, refusals, another request under a key,
// short deadlines and failures on purpose at every step. Once the faults
// stop, every unfinished operation is driven to its end with Resume; the
// history is checked per key (lincheck.CheckOperations), and the database
// and the provider are reconciled with it: each step's rows once, one
// effect per operation under its derived key, every returned answer the
// stored one, nothing left unfinished.
//
// What it asserts does not depend on timing: the run's length and the
// checker's time are bounds, and a key the checker cannot decide in time is
// reported, not failed.
func TestLinearizability(t *testing.T) {
	t.Parallel()
	settings := linSettingsFromEnv(t)
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			for _, seed := range settings.seeds {
				t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
					runLinearizability(t, l, seed, settings.duration)
				})
			}
		})
	}
}

// linClientApp is the application_name of the Do clients' connections:
// with the operation clients' (linOpClientApp), the only backends the
// fault injector terminates.
const linClientApp = "idem-linearizability"

// linLedgerSQL is the business table of the check: one row per execution
// of fn, tagged with the call's key and operation id, with no unique
// constraint that would hide a second execution.
const linLedgerSQL = `CREATE TABLE lin_ledger (
    id  bigserial PRIMARY KEY,
    key text   NOT NULL,
    op  bigint NOT NULL
)`

func runLinearizability(t *testing.T, l layout, seed uint64, duration time.Duration) {
	ctx := context.Background()
	u := testdb.URL(t)
	admin, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := admin.Exec(ctx, linLedgerSQL); err != nil {
		t.Fatal(err)
	}
	if l.apply != nil {
		if err := l.apply(ctx, admin); err != nil {
			t.Fatal(err)
		}
	}
	// Operations run on the plain layout only: the partitioned one refuses
	// them.
	withOps := l.name == plain.name
	apps := []string{linClientApp}
	if withOps {
		if _, err := admin.Exec(ctx, linOpLedgerSQL); err != nil {
			t.Fatal(err)
		}
		apps = append(apps, linOpClientApp)
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = linPoolSize
	cfg.ConnConfig.RuntimeParams["application_name"] = linClientApp
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	faults, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = faults.Close(context.Background()) })

	w := &linWorkload{pool: pool, partitioned: l.name == partitioned.name, seed: seed, duration: duration}
	ow := newLinOpWorkload(u, seed, duration)
	stop := make(chan struct{})
	injected := make(chan linFaults, 1)
	go func() { injected <- terminateBackends(faults, seed, apps, stop) }()
	var (
		opCalls []lincheck.OpCall
		opErr   error
		opsDone = make(chan struct{})
	)
	go func() {
		defer close(opsDone)
		if withOps {
			opCalls, opErr = ow.run(ctx)
		}
	}()
	calls := w.run()
	<-opsDone
	close(stop)
	f := <-injected
	if f.err != nil {
		t.Errorf("fault injector: %v", f.err)
	}
	if opErr != nil {
		t.Fatalf("operation clients: %v", opErr)
	}

	// Every connection under test ends before the database is read: a
	// COMMIT whose client gave up may still be running on the server.
	pool.Close()
	settleBackends(t, admin, apps)
	var unsettled []string
	if withOps {
		if opCalls, unsettled, err = ow.settle(ctx); err != nil {
			t.Fatalf("settling the operations: %v", err)
		}
		settleBackends(t, admin, []string{linOpSettleApp})
	}
	final := readFinal(t, admin)
	checkStart := time.Now()
	r := lincheck.Check(calls, final, linCheckBound)
	checked := time.Since(checkStart)

	t.Logf("%s, seed %d, %v: %d calls over %d keys; by kind: %s; in detail: %s; faults injected: %d backends terminated (%d rounds); violations: %d; keys the checker could not decide in time: %d %v; checked in %v",
		l.name, seed, duration, r.Calls, r.Keys, byKind(r), details(w.details),
		f.byApp[linClientApp], f.attempts, len(r.Violations), len(r.Inconclusive), r.Inconclusive, checked.Round(time.Millisecond))
	reportViolations(t, r.Violations)
	if r.ByKind[lincheck.Executed] == 0 || f.byApp[linClientApp] == 0 {
		t.Errorf("the run proved nothing: %d executions, %d backends terminated", r.ByKind[lincheck.Executed], f.byApp[linClientApp])
	}
	if !withOps {
		return
	}

	opFinal := readOpFinal(t, admin, ow)
	checkStart = time.Now()
	opr := lincheck.CheckOperations(opCalls, opFinal, linCheckBound)
	checked = time.Since(checkStart)
	runs, takeovers := ow.takeovers()
	t.Logf("%s, seed %d, %v, operations (lease %v): %d calls over %d keys, %d of them settling Resume calls (%d finished an operation); by kind: %s; in detail: %s; owner runs %d, takeovers %d, runs that resumed after a recorded step %d, paused owners %d (%d of them overtaken), step functions that returned after their owner lost its lease %d; provider: %d calls, %d effects; faults injected: %d backends terminated; violations: %d; keys the checker could not decide in time: %d %v; checked in %v",
		l.name, seed, duration, linOpLease, opr.Calls, opr.Keys, ow.settled, ow.completed, byKind(opr), details(ow.details),
		runs, takeovers, ow.resumed, ow.pauses, ow.overtaken, ow.staleReturns(), ow.provider.calls, len(opFinal.Effects),
		f.byApp[linOpClientApp], len(opr.Violations), len(opr.Inconclusive), opr.Inconclusive, checked.Round(time.Millisecond))
	if len(unsettled) > 0 {
		t.Errorf("%d operations still unfinished after settling for %v: %v", len(unsettled), linOpSettleBound, unsettled)
	}
	reportViolations(t, opr.Violations)
	if opr.ByKind[lincheck.Executed] == 0 || takeovers == 0 || f.byApp[linOpClientApp] == 0 {
		t.Errorf("the operations' run proved nothing: %d executions, %d takeovers, %d backends terminated",
			opr.ByKind[lincheck.Executed], takeovers, f.byApp[linOpClientApp])
	}
}

// byKind lists a report's calls by how they ended.
func byKind(r lincheck.Report) string {
	kinds := make([]string, 0, len(lincheck.Kinds))
	for _, k := range lincheck.Kinds {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, r.ByKind[k]))
	}
	return strings.Join(kinds, ", ")
}

// details lists the finer classes of a workload's calls.
func details(m map[string]int) string {
	d := slices.Sorted(maps.Keys(m))
	for i, k := range d {
		d[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(d, ", ")
}

// reportViolations fails the test with the first linMaxReported violations.
func reportViolations(t *testing.T, violations []lincheck.Violation) {
	t.Helper()
	for i, v := range violations {
		if i == linMaxReported {
			t.Errorf("... and %d more violations", len(violations)-i)
			break
		}
		t.Errorf("violation: %v", v)
	}
}

const (
	// linCheckBound bounds the linearizability checker's time per key.
	linCheckBound = 2 * time.Second
	// linMaxReported is how many violations a run lists.
	linMaxReported = 30
	// linSettleBound bounds the wait for the server to end the backends of
	// the closed pool.
	linSettleBound = 30 * time.Second
)

// settleBackends waits until the server has ended every backend of apps.
func settleBackends(t *testing.T, admin *pgxpool.Pool, apps []string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(linSettleBound)
	for {
		var n int
		if err := admin.QueryRow(ctx,
			"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = ANY($1)",
			apps).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends under test still running %v after their pool closed: the database cannot be reconciled", n, linSettleBound)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readFinal reads every key's row and every ledger row of the Do clients
// (keys k-…; the operation clients' are o-…).
func readFinal(t *testing.T, admin *pgxpool.Pool) lincheck.Final {
	t.Helper()
	ctx := context.Background()
	final := lincheck.Final{Keys: map[string]lincheck.Stored{}, Rows: map[string]int{}, Ledger: map[string][]int64{}}
	rows, err := admin.Query(ctx, "SELECT idempotency_key, status, request_hash, response, refusal IS NOT NULL FROM idempotency_keys WHERE idempotency_key LIKE 'k-%'")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var (
			key, status, hash string
			response          []byte
			s                 lincheck.Stored
		)
		if err := rows.Scan(&key, &status, &hash, &response, &s.Refused); err != nil {
			t.Fatal(err)
		}
		s.Status, s.Hash = status, hash
		if status != "in_progress" {
			var v linValue
			if err := json.Unmarshal(response, &v); err != nil {
				t.Errorf("key %s: stored response %q: %v", key, response, err)
			}
			s.Op = v.Op
		}
		// On the partitioned layout the primary key does not make a key
		// unique: a second row is a second execution, a violation whichever
		// row is kept here.
		final.Rows[key]++
		if prev, seen := final.Keys[key]; !seen || prev.Status == "in_progress" {
			final.Keys[key] = s
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = admin.Query(ctx, "SELECT key, op FROM lin_ledger")
	if err != nil {
		t.Fatal(err)
	}
	var (
		key string
		op  int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &op}, func() error {
		final.Ledger[key] = append(final.Ledger[key], op)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return final
}
