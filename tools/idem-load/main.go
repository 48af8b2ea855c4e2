// Command idem-load runs idem.Do from several operating-system processes at
// once against one PostgreSQL database and then checks, from the database
// alone, that every logical operation committed exactly once.
//
// The parent process creates a fresh database (idem_load_<pid>) on the
// server named by IDEM_TEST_DATABASE_URL or DATABASE_URL, or on
// 127.0.0.1:5432 (through IDEM_TEST_ADMIN_URL when set, as the tests do
// behind a pooler), applies idem's schema and a ledger table, and starts
// -workers copies of itself. Each worker has its own pool and runs -clients
// clients that send fresh keys and retries of their own earlier keys, and
// -race-width racers that send the same new key as the racers of every other
// worker at the same instant (the parent holds them at a barrier). Every call
// is idem.Do inserting one ledger row whose amount derives from the key.
// Workers write what each call returned to a file; the parent reconciles
// those answers with the ledger and the key table, prints the figures,
// drops the database, and exits with status 1 on any violation or error.
//
// The schedule (which call is fresh, a retry or a race) derives from -seed,
// so every worker knows the race keys without talking to the others.
//
//	go run ./idem-load -ops 100000 -workers 4 -clients 8
//
// With -crash it is the crash test instead (crash.go): -apps application
// processes serve the operations over HTTP through idemhttp, the clients run
// in the parent and retry every failure with the same key, and the run kills
// the applications with SIGKILL and crashes PostgreSQL with the -db-stop and
// -db-start commands at the points -faults names; scripts/crashtest.sh runs
// it on a PostgreSQL cluster of its own. With -crash -payments BINARY the
// application is the payments example's service instead (payments.go),
// with -processor BINARY settling every payment at a fake processor.
//
// With -failover it is the replica promotion test (failover.go), which
// scripts/failover-test.sh runs against a primary and a streaming standby.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

// plan is the load's shape; parent and workers derive the same schedule
// from it.
type plan struct {
	ops       int
	workers   int
	clients   int
	raceWidth int
	retryFrac float64
	raceFrac  float64
	seed      uint64
	timeout   time.Duration
}

func main() {
	var (
		p      plan
		worker = flag.Int("worker", -1, "internal: run as worker `n` (set by the parent)")
		dbURL  = flag.String("worker-url", "", "internal: the database a worker uses")
		out    = flag.String("worker-out", "", "internal: the file a worker writes its answers to")
		keep   = flag.Bool("keep", false, "keep the database afterwards, for inspection")

		crashMode = flag.Bool("crash", false, "run the crash test: application processes killed and PostgreSQL crashed under retrying clients")
		app       = flag.Bool("app", false, "internal: run as a crash test application process")
		listen    = flag.String("listen", "127.0.0.1:0", "internal: the address an application process listens on")
		cp        crashPlan
		faults    = flag.String("faults", defaultFaults, "crash test: faults as kind@percent of the operations answered; kinds app<n>, apps, db, all")

		paymentsBin  = flag.String("payments", "", "crash test: drive the payments example's service, this binary (built from payments_example), instead of the built-in application")
		processorBin = flag.String("processor", "", "crash test with -payments: settle every payment at the fake processor, this binary (payments_example/cmd/processor)")
		ps           paymentsService

		failoverMode = flag.Bool("failover", false, "run the replica promotion test (see scripts/failover-test.sh)")
		fp           failoverPlan
	)
	flag.IntVar(&cp.apps, "apps", 2, "crash test: application processes")
	flag.StringVar(&cp.dbStop, "db-stop", "", "crash test: shell command that crashes PostgreSQL (e.g. pg_ctlcluster ... stop -m immediate)")
	flag.StringVar(&cp.dbStart, "db-start", "", "crash test: shell command that starts PostgreSQL again")
	flag.DurationVar(&cp.dbDown, "db-down", time.Second, "crash test: how long PostgreSQL stays down")
	flag.DurationVar(&cp.opTimeout, "op-timeout", 3*time.Minute, "crash test: a client gives up on an operation after this")
	flag.IntVar(&ps.accounts, "accounts", 8, "crash test with -payments: accounts (principals) the clients share; the first is opened with too little money")
	flag.DurationVar(&ps.settleTimeout, "settle-timeout", 10*time.Minute, "crash test with -processor: every payment must be settled this long after the last answer")
	procFail := flag.Float64("processor-fail", 0.1, "crash test with -processor: share of the processor's calls answered 503")
	procLose := flag.Float64("processor-lose", 0.1, "crash test with -processor: share of the processor's answers lost after charging")
	flag.StringVar(&fp.standbyURL, "standby-url", "", "failover test: the standby's server URL")
	flag.StringVar(&fp.primaryStop, "primary-stop", "", "failover test: shell command that crashes the primary")
	flag.StringVar(&fp.waldump, "waldump", "", "failover test: pg_waldump, to count the transactions the standby's WAL holds only part of")
	flag.StringVar(&fp.standbyWAL, "standby-wal", "", "failover test: the standby's pg_wal directory, for -waldump")
	flag.StringVar(&fp.cut, "cut", "stream", "failover test: how the standby falls behind: stream (it stops receiving WAL) or pause (pg_wal_replay_pause)")
	flag.IntVar(&p.ops, "ops", 100_000, "scheduled calls in total, across all processes")
	flag.IntVar(&p.workers, "workers", 4, "worker processes")
	flag.IntVar(&p.clients, "clients", 8, "clients per worker sending fresh keys and retries")
	flag.IntVar(&p.raceWidth, "race-width", 2, "racers per worker; each race has workers*race-width contenders")
	flag.Float64Var(&p.retryFrac, "retry", 0.20, "share of calls that retry a key already used")
	flag.Float64Var(&p.raceFrac, "race", 0.05, "share of calls that race on a new key across processes")
	flag.Uint64Var(&p.seed, "seed", 1, "seed of the key schedule")
	flag.DurationVar(&p.timeout, "timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })

	if *app {
		appMain(*dbURL, *listen)
		return
	}
	if *crashMode || *failoverMode {
		// One process of clients, no cross-process races; fewer calls.
		p.workers, p.raceFrac = 1, 0
		if !set["ops"] {
			p.ops = 50_000
			if *failoverMode || *paymentsBin != "" {
				p.ops = 20_000
			}
		}
		if !set["clients"] {
			p.clients = 16
		}
		if !set["timeout"] {
			p.timeout = 15 * time.Minute
		}
	}
	if err := p.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "idem-load:", err)
		os.Exit(2)
	}
	if *worker >= 0 {
		if err := runWorker(p, *worker, *dbURL, *out); err != nil {
			fmt.Fprintf(os.Stderr, "idem-load worker %d: %v\n", *worker, err)
			os.Exit(1)
		}
		return
	}
	switch {
	case *crashMode:
		var err error
		if cp.faults, err = parseFaults(*faults, cp.apps); err != nil || cp.apps < 1 {
			fmt.Fprintln(os.Stderr, "idem-load: -faults, -apps:", err)
			os.Exit(2)
		}
		if *paymentsBin == "" {
			if *processorBin != "" {
				fmt.Fprintln(os.Stderr, "idem-load: -processor needs -payments")
				os.Exit(2)
			}
			self, err := os.Executable()
			if err != nil {
				fmt.Fprintln(os.Stderr, "idem-load:", err)
				os.Exit(1)
			}
			os.Exit(runCrash(p, cp, &libApp{self: self, p: p}, *keep))
		}
		if ps.accounts < 1 || *processorBin != "" && ps.settleTimeout <= 0 {
			fmt.Fprintln(os.Stderr, "idem-load: -accounts and -settle-timeout must be positive")
			os.Exit(2)
		}
		ps.bin, ps.p, ps.opTimeout = *paymentsBin, p, cp.opTimeout
		os.Exit(runPaymentsCrash(p, cp, &ps, *processorBin, *procFail, *procLose, *keep))
	case *failoverMode:
		os.Exit(runFailover(p, fp, *keep))
	}
	os.Exit(runParent(p, *keep))
}

func (p plan) validate() error {
	switch {
	case p.ops < 1 || p.workers < 1 || p.clients < 1 || p.raceWidth < 1:
		return fmt.Errorf("-ops, -workers, -clients and -race-width must be positive")
	case p.retryFrac < 0 || p.raceFrac < 0 || p.retryFrac+p.raceFrac >= 1:
		return fmt.Errorf("-retry and -race must be non-negative and sum to less than 1")
	}
	return nil
}
