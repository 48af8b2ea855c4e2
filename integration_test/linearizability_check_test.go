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

	"github.com/idemhq/idem/internal/lincheck"
	"github.com/idemhq/idem/internal/testdb"
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
// (internal/lincheck, with porcupine), and the database is reconciled with
// it: a call told "failed" must have committed nothing, since its caller may
// retry with a new key.
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

// linClientApp is the application_name of the connections under test: the
// only backends the fault injector terminates.
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
	stop := make(chan struct{})
	injected := make(chan linFaults, 1)
	go func() { injected <- terminateBackends(faults, seed, stop) }()
	calls := w.run()
	close(stop)
	f := <-injected
	if f.err != nil {
		t.Errorf("fault injector: %v", f.err)
	}

	// Every connection under test ends before the database is read: a
	// COMMIT whose client gave up may still be running on the server.
	pool.Close()
	settleBackends(t, admin)
	final := readFinal(t, admin)
	checkStart := time.Now()
	r := lincheck.Check(calls, final, linCheckBound)
	checked := time.Since(checkStart)

	kinds := make([]string, 0, len(lincheck.Kinds))
	for _, k := range lincheck.Kinds {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, r.ByKind[k]))
	}
	details := slices.Sorted(maps.Keys(w.details))
	for i, d := range details {
		details[i] = fmt.Sprintf("%s %d", d, w.details[d])
	}
	t.Logf("%s, seed %d, %v: %d calls over %d keys; by kind: %s; in detail: %s; faults injected: %d backends terminated (%d attempts); violations: %d; keys the checker could not decide in time: %d %v; checked in %v",
		l.name, seed, duration, r.Calls, r.Keys, strings.Join(kinds, ", "), strings.Join(details, ", "),
		f.terminated, f.attempts, len(r.Violations), len(r.Inconclusive), r.Inconclusive, checked.Round(time.Millisecond))
	for i, v := range r.Violations {
		if i == linMaxReported {
			t.Errorf("... and %d more violations", len(r.Violations)-i)
			break
		}
		t.Errorf("violation: %v", v)
	}
	if r.ByKind[lincheck.Executed] == 0 || f.terminated == 0 {
		t.Errorf("the run proved nothing: %d executions, %d backends terminated", r.ByKind[lincheck.Executed], f.terminated)
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

// settleBackends waits until the server has ended every backend under test.
func settleBackends(t *testing.T, admin *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(linSettleBound)
	for {
		var n int
		if err := admin.QueryRow(ctx,
			"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1",
			linClientApp).Scan(&n); err != nil {
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

// readFinal reads every key's row and every ledger row.
func readFinal(t *testing.T, admin *pgxpool.Pool) lincheck.Final {
	t.Helper()
	ctx := context.Background()
	final := lincheck.Final{Keys: map[string]lincheck.Stored{}, Rows: map[string]int{}, Ledger: map[string][]int64{}}
	rows, err := admin.Query(ctx, "SELECT idempotency_key, status, request_hash, response, refusal IS NOT NULL FROM idempotency_keys")
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
