// Command idem-retention measures how the key table is kept at a steady
// size under sustained load: the plain table with the batched DELETE
// sweeper, and the partitioned table (schema.ApplyPartitioned) whose
// partitions Sweep drops whole, side by side under the same load.
//
// For each layout it creates a database idem_retention_<pid>_<layout> on the
// server named by IDEM_TEST_DATABASE_URL or DATABASE_URL (else
// 127.0.0.1:5432, user postgres), runs idem.Do with new keys from -workers
// goroutines as fast as the machine allows, first for a third of -duration
// with no cleanup, then for the rest with Sweep running every -sweep-every,
// samples the table every -sample, prints the samples and a side-by-side
// summary, and drops the database.
//
//	go run ./idem-retention                    # 3 minutes per layout, TTL 30s, 10s partitions
//	go run ./idem-retention -short             # 45 s per layout, TTL 5s, 2s partitions
//	go run ./idem-retention -duration 10m -ttl 1m -interval 20s
//	go run ./idem-retention -rounds 2 -duration 90s   # alternate the layouts
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/testkit/pgurl"
)

type options struct {
	duration   time.Duration
	ttl        time.Duration
	interval   time.Duration
	sweepEvery time.Duration
	sample     time.Duration
	workers    int
	layouts    []string
	rounds     int
}

func main() {
	var o options
	var short bool
	var only string
	flag.DurationVar(&o.duration, "duration", 3*time.Minute, "load per layout: a third without cleanup, the rest with it")
	flag.DurationVar(&o.ttl, "ttl", 30*time.Second, "key TTL")
	flag.DurationVar(&o.interval, "interval", 10*time.Second, "partition interval of the partitioned layout (whole seconds)")
	flag.DurationVar(&o.sweepEvery, "sweep-every", 0, "how often Sweep runs once cleanup starts (default: half the interval)")
	flag.DurationVar(&o.sample, "sample", 0, "how often the table is sampled (default: duration/18)")
	flag.IntVar(&o.workers, "workers", 8, "goroutines calling idem.Do")
	flag.StringVar(&only, "layout", "plain,partitioned", "the layouts to run, in this order: plain, partitioned or both")
	flag.IntVar(&o.rounds, "rounds", 1, "run the layouts this many times, alternating, to see how much the shared machine moves the figures")
	flag.BoolVar(&short, "short", false, "a quick run: 45s per layout, TTL 5s, 2s partitions")
	flag.Parse()
	if short {
		o.duration, o.ttl, o.interval = 45*time.Second, 5*time.Second, 2*time.Second
	}
	if o.sweepEvery == 0 {
		o.sweepEvery = o.interval / 2
	}
	if o.sample == 0 {
		o.sample = o.duration / 18
	}
	o.layouts = strings.Split(only, ",")
	for _, l := range o.layouts {
		if l != "plain" && l != "partitioned" {
			o.rounds = 0
		}
	}
	if o.duration < 3*o.ttl/2 || o.interval < time.Second || o.workers < 1 || o.rounds < 1 {
		fmt.Fprintln(os.Stderr, "idem-retention: want -duration of at least 1.5 TTL, -interval of at least 1s, -workers >= 1, -rounds >= 1, -layout of plain and/or partitioned")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-retention:", err)
		os.Exit(1)
	}
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
	var version string
	if err := maint.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return err
	}
	fmt.Printf("idem-retention: PostgreSQL %s; %v per layout (%v without cleanup, then Sweep every %v), TTL %v, partitions of %v, %d workers\n\n",
		version, o.duration, o.duration/3, o.sweepEvery, o.ttl, o.interval, o.workers)

	var results []*result
	for round := 1; round <= o.rounds; round++ {
		for _, layout := range o.layouts {
			r, err := measureIn(ctx, o, maint, server, layout)
			if err != nil {
				return err
			}
			if o.rounds > 1 {
				r.layout = fmt.Sprintf("%s#%d", layout, round)
			}
			r.print(o)
			results = append(results, r)
		}
	}
	summary(o, results)
	return nil
}

// measureIn runs one layout in a database of its own.
func measureIn(ctx context.Context, o options, maint *pgx.Conn, server *pgx.ConnConfig, layout string) (*result, error) {
	{
		name := fmt.Sprintf("idem_retention_%d_%s", os.Getpid(), layout)
		if _, err := maint.Exec(ctx, "CREATE DATABASE "+name); err != nil {
			return nil, fmt.Errorf("create database: %w", err)
		}
		r, err := measure(ctx, o, server, name, layout)
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if _, derr := maint.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); derr != nil {
			fmt.Fprintln(os.Stderr, "idem-retention: drop database:", derr)
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", layout, err)
		}
		return r, nil
	}
}
