// Command idem-bench measures idem.Do against the same work done in a bare
// pgx transaction, against replays of completed keys, and against the
// common pattern of writing the key in transactions of its own.
//
// It creates a database idem_bench_<pid> on the server named by
// IDEM_TEST_DATABASE_URL or DATABASE_URL (else 127.0.0.1:5432, user
// postgres), runs every variant in interleaved cycles at each client count,
// then again over an emulated network (a proxy that delays every packet),
// prints medians and side-by-side ratios, and drops the database.
//
//	go run ./idem-bench [-cycles 15] [-slice 400ms] [-clients 1,8,32] [-rtt 1ms]
//	go run ./idem-bench -components   # server CPU of each protocol piece
//	go run ./idem-bench -http         # idemhttp against a bare handler, and memory per request
//	go run ./idem-bench -operations   # a charge at a slow processor: Do, idem.Operation, DBOS Transact
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/schema"
	"github.com/idemhq/idem/testkit/pgurl"
)

type options struct {
	cycles   int
	slice    time.Duration
	clients  []int
	tripOps  int
	allocOps int
	// costRounds is how many times the CPU and allocation counts run, one
	// round after the other, each on fresh tables.
	costRounds int
	rtt        time.Duration
	rttN       []int
	parts      bool
	http       bool
	inflight   int
	// The -operations mode (operations.go).
	ops         bool
	opLatencies []time.Duration
	opClients   int
	opLimit     int
	opPool      int
	opWindow    time.Duration
	opCycles    int
	opSlice     time.Duration
	opTripOps   int
}

func main() {
	var o options
	var clients, rttClients, opLatencies string
	flag.IntVar(&o.cycles, "cycles", 15, "interleaved cycles per client count; each runs every variant once")
	flag.DurationVar(&o.slice, "slice", 400*time.Millisecond, "how long one variant runs in one cycle")
	flag.StringVar(&clients, "clients", "1,8,32", "comma-separated concurrent client counts")
	flag.DurationVar(&o.rtt, "rtt", time.Millisecond, "emulated network round trip for the extra levels; 0 skips them")
	flag.StringVar(&rttClients, "rtt-clients", "1,8", "client counts run over the emulated network")
	flag.BoolVar(&o.parts, "components", false, "only price the protocol's pieces in server CPU (server on this machine)")
	flag.BoolVar(&o.http, "http", false, "only compare idemhttp with a bare handler over HTTP, and measure memory per request in flight")
	flag.IntVar(&o.inflight, "http-inflight", 32, "requests held in flight at once in the -http memory measurement")
	flag.BoolVar(&o.ops, "operations", false, "only compare a charge at a slow processor in one Do, as an idem.Operation and as a DBOS Transact workflow")
	flag.StringVar(&opLatencies, "op-latencies", "1s,2s,0s", "-operations: comma-separated processor latencies of the throughput measurement")
	flag.IntVar(&o.opClients, "op-clients", 400, "-operations: concurrent clients of the throughput measurement")
	flag.IntVar(&o.opLimit, "op-limit", 200, "-operations: charges the processor serves at once; 0 for no limit")
	flag.IntVar(&o.opPool, "op-pool", 10, "-operations: pool size (MaxConns)")
	flag.DurationVar(&o.opWindow, "op-window", 12*time.Second, "-operations: measured span of each throughput figure, after a warm-up")
	flag.IntVar(&o.opCycles, "op-cycles", 5, "-operations: interleaved cycles of the per-call measurement")
	flag.DurationVar(&o.opSlice, "op-slice", time.Second, "-operations: how long one call variant runs in one cycle")
	flag.IntVar(&o.opTripOps, "op-trip-ops", 100, "-operations: calls per variant in the round-trip count")
	flag.IntVar(&o.tripOps, "trip-ops", 300, "operations per variant in the round-trip count")
	flag.IntVar(&o.allocOps, "alloc-ops", 400, "operations per variant in each round of the CPU and allocation count")
	flag.IntVar(&o.costRounds, "cost-rounds", 15, "rounds of the CPU and allocation count; the table shows medians and the spread")
	flag.Parse()
	var err error
	if o.clients, err = counts(clients); err == nil {
		o.rttN, err = counts(rttClients)
	}
	if err == nil {
		o.opLatencies, err = durations(opLatencies)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err = run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-bench:", err)
		os.Exit(1)
	}
}

func counts(list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad client count %q in %q", s, list)
		}
		out = append(out, n)
	}
	return out, nil
}

func durations(list string) ([]time.Duration, error) {
	var out []time.Duration
	for _, s := range strings.Split(list, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d < 0 {
			return nil, fmt.Errorf("bad latency %q in %q", s, list)
		}
		out = append(out, d)
	}
	return out, nil
}

func run(ctx context.Context, o options) error {
	server, err := pgx.ParseConfig(pgurl.Server())
	if err != nil {
		return err
	}
	maint, err := pgx.ConnectConfig(ctx, server)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer maint.Close(context.Background())
	dbName := fmt.Sprintf("idem_bench_%d", os.Getpid())
	if _, err := maint.Exec(ctx, "CREATE DATABASE "+dbName); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := maint.Exec(ctx, "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)"); err != nil {
			fmt.Fprintln(os.Stderr, "idem-bench: drop database:", err)
		}
	}()

	var version string
	if err := maint.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return err
	}

	b := &bench{opts: o, dbName: dbName, server: server}
	b.admin, err = b.pool(ctx, 1, "")
	if err != nil {
		return err
	}
	defer b.admin.Close()
	if err := schema.Apply(ctx, b.admin); err != nil {
		return err
	}
	if _, err := b.admin.Exec(ctx, setupSQL); err != nil {
		return fmt.Errorf("set up tables: %w", err)
	}
	for _, s := range schemas {
		if _, err := b.admin.Exec(ctx, fmt.Sprintf(tablesSQL, s, accounts)); err != nil {
			return fmt.Errorf("set up tables: %w", err)
		}
	}

	if o.ops {
		fmt.Printf("idem-bench -operations: PostgreSQL %s, %s, GOMAXPROCS %d\n\n", version, goVersion(), gomaxprocs())
		return b.operationsMode(ctx, os.Stdout)
	}
	fmt.Printf("idem-bench: PostgreSQL %s, %s, GOMAXPROCS %d; per client count, %d cycles of %v per variant\n\n",
		version, goVersion(), gomaxprocs(), o.cycles, o.slice)

	if o.parts {
		return b.components(ctx, os.Stdout)
	}
	if o.http {
		return b.httpMode(ctx, os.Stdout)
	}
	trips, err := b.countTrips(ctx)
	if err != nil {
		return fmt.Errorf("round trips: %w", err)
	}
	cost, err := b.countCosts(ctx)
	if err != nil {
		return fmt.Errorf("costs: %w", err)
	}
	var levels []level
	for _, n := range o.clients {
		l, err := b.timed(ctx, n, o.cycles, nil)
		if err != nil {
			return fmt.Errorf("%d clients: %w", n, err)
		}
		levels = append(levels, l)
	}
	if o.rtt > 0 {
		// The same comparison over an emulated network, where round trips,
		// not CPU, dominate: fewer cycles, as each slice does less.
		p, err := startProxy(ctx, net.JoinHostPort(server.Host, fmt.Sprint(server.Port)), o.rtt/2)
		if err != nil {
			return err
		}
		defer p.close()
		for _, n := range o.rttN {
			l, err := b.timed(ctx, n, max(3, o.cycles/2), p)
			if err != nil {
				return fmt.Errorf("%d clients over %v: %w", n, o.rtt, err)
			}
			levels = append(levels, l)
		}
	}
	report(os.Stdout, levels, trips, cost)
	return nil
}

type bench struct {
	opts   options
	dbName string
	server *pgx.ConnConfig
	admin  *pgxpool.Pool
}

// pool opens a pool of at most n connections on the benchmark database,
// through proxy (host:port) if it is not empty.
func (b *bench) pool(ctx context.Context, n int, proxy string) (*pgxpool.Pool, error) {
	return b.poolOn(ctx, b.dbName, n, proxy)
}

// poolOn is pool on the database named database.
func (b *bench) poolOn(ctx context.Context, database string, n int, proxy string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig = b.server.Copy()
	cfg.ConnConfig.Database = database
	if proxy != "" {
		cfg.ConnConfig.Host = "127.0.0.1"
		port, _ := strconv.Atoi(proxy[strings.LastIndexByte(proxy, ':')+1:])
		cfg.ConnConfig.Port = uint16(port)
		cfg.ConnConfig.Fallbacks = nil
	}
	cfg.MaxConns, cfg.MinConns = int32(n), int32(n)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// reset empties the ledgers and the key tables and vacuums the accounts, so
// that every client count starts from the same state.
func (b *bench) reset(ctx context.Context) error {
	if _, err := b.admin.Exec(ctx, resetSQL); err != nil {
		return err
	}
	_, err := b.admin.Exec(ctx, vacuumSQL)
	return err
}
