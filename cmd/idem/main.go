// Command idem runs the operations of an idem key table: create it, sweep
// expired keys, report on it, and show one key.
//
//	go run github.com/idemhq/idem/cmd/idem migrate [-table T] [-partitioned [-interval 24h]]
//	go run github.com/idemhq/idem/cmd/idem sweep [-table T] [-every 1m]
//	go run github.com/idemhq/idem/cmd/idem stats [-table T]
//	go run github.com/idemhq/idem/cmd/idem inspect [-table T] [-scope S] KEY
//
// The database is DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable). Exit codes: 0
// success, 1 failure, 2 usage error, 3 key not found (inspect).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/schema"
)

// DefaultURL is the database used when DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Exit codes.
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitNotFound = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `idem: operations on an idem key table.

Usage:
  idem <command> [flags] [arguments]

Commands:
  migrate   Create the key table, or complete it (safe to repeat).
            -partitioned makes the partitioned layout (schema/partitioned):
            partitions of -interval (default 24h, whole seconds, at least
            1s) on created_at, dropped whole by sweep once their keys
            expired. A plain table cannot be turned into a partitioned one.
  sweep     Remove expired keys once, or every -every (e.g. 1m) until
            interrupted. Plain table: batched DELETE. Partitioned table:
            make partitions ahead, drop those whose keys all expired, delete
            from the DEFAULT partition (or run pg_partman's maintenance if it
            manages the table). Prints how many keys it removed.
  stats     Keys that replay, keys in progress now and the oldest one's age,
            expired keys awaiting the sweeper, the table's size, and its
            partitions. Counting reads the whole table.
  inspect   Show one key (Client.Lookup): status, created, completed and
            expires times, request hash, result size, refusal. -scope is the
            key's scope as stored (default empty).

Flags of every command:
  -table    the key table, optionally schema-qualified (default idempotency_keys)

Environment:
  DATABASE_URL   the database (default ` + DefaultURL + `)

Exit codes: 0 success, 1 failure, 2 usage error, 3 key not found (inspect).
Run "idem <command> -h" for a command's flags.
`

// run is the command: args without the program name; it returns the exit
// code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fs := flag.NewFlagSet("idem "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	table := fs.String("table", idem.DefaultTable, "the key table, optionally schema-qualified")
	var (
		partitioned *bool
		interval    *time.Duration
		every       *time.Duration
		scope       *string
	)
	switch cmd {
	case "migrate":
		partitioned = fs.Bool("partitioned", false, "create the partitioned layout")
		interval = fs.Duration("interval", schema.DefaultPartitionInterval, "partition interval with -partitioned (whole seconds, at least 1s)")
	case "sweep":
		every = fs.Duration("every", 0, "sweep every interval until interrupted (0: once)")
	case "stats":
	case "inspect":
		scope = fs.String("scope", "", "the key's scope, as stored")
	default:
		fmt.Fprintf(stderr, "idem: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage of idem %s:\n", cmd)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	switch {
	case cmd == "inspect" && fs.NArg() != 1:
		fmt.Fprintln(stderr, "idem inspect: want exactly one KEY")
		return exitUsage
	case cmd != "inspect" && fs.NArg() != 0:
		fmt.Fprintf(stderr, "idem %s: unexpected arguments %q\n", cmd, fs.Args())
		return exitUsage
	case cmd == "migrate" && !*partitioned && isSet(fs, "interval"):
		fmt.Fprintln(stderr, "idem migrate: -interval needs -partitioned")
		return exitUsage
	case every != nil && *every < 0:
		fmt.Fprintln(stderr, "idem sweep: -every must not be negative")
		return exitUsage
	}

	url := getenv("DATABASE_URL")
	if url == "" {
		url = DefaultURL
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(stderr, "idem:", err)
		return exitFailure
	}
	defer pool.Close()
	keys, err := idem.NewClient(pool, &idem.Config{Table: *table})
	if err != nil {
		fmt.Fprintln(stderr, "idem:", err)
		return exitUsage
	}

	switch cmd {
	case "migrate":
		err = migrate(ctx, pool, *table, *partitioned, *interval, stdout)
	case "sweep":
		err = sweep(ctx, keys, *every, stdout, stderr)
	case "stats":
		err = stats(ctx, newSQLStats(pool, *table), stdout)
	case "inspect":
		err = inspect(ctx, keys, *scope, fs.Arg(0), stdout)
		if errors.Is(err, idem.ErrNotFound) {
			fmt.Fprintf(stderr, "idem inspect: no key %q in scope %q\n", fs.Arg(0), *scope)
			return exitNotFound
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "idem %s: %s\n", cmd, strings.TrimPrefix(err.Error(), "idem: "))
		if errors.Is(err, idem.ErrInvalidKey) || errors.Is(err, idem.ErrInvalidScope) || errors.Is(err, idem.ErrInvalidOption) {
			return exitUsage
		}
		return exitFailure
	}
	return exitOK
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func migrate(ctx context.Context, pool *pgxpool.Pool, table string, partitioned bool, interval time.Duration, stdout io.Writer) error {
	if partitioned {
		if err := schema.ApplyPartitioned(ctx, pool, table, interval); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: partitioned by created_at\n", table)
		return nil
	}
	if err := schema.ApplyTable(ctx, pool, table); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ready\n", table)
	return nil
}

func sweep(ctx context.Context, keys *idem.Client, every time.Duration, stdout, stderr io.Writer) error {
	once := func() error {
		n, err := keys.Sweep(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s %s: removed %d expired keys\n", time.Now().UTC().Format(time.RFC3339), keys.Table(), n)
		return nil
	}
	if every == 0 {
		return once()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// A failed sweep is reported and retried at the next tick, as
		// idem.SweepEvery does.
		if err := once(); err != nil && ctx.Err() == nil {
			fmt.Fprintln(stderr, "idem sweep:", err)
		}
		select {
		case <-ctx.Done():
			return nil // interrupted: a normal end
		case <-t.C:
		}
	}
}

func inspect(ctx context.Context, keys *idem.Client, scope, key string, stdout io.Writer) error {
	rec, err := keys.Lookup(ctx, scope, key)
	if err != nil {
		return err
	}
	w := func(name, value string) { fmt.Fprintf(stdout, "%-13s %s\n", name+":", value) }
	w("key", fmt.Sprintf("%q", rec.Key))
	w("scope", fmt.Sprintf("%q", rec.Scope))
	status := string(rec.Status)
	if rec.Status != idem.StatusInProgress && rec.Expired(time.Now()) {
		status += " (expired, awaiting the sweeper)"
	}
	w("status", status)
	if rec.Status == idem.StatusInProgress && rec.CreatedAt.IsZero() {
		w("note", "a transaction holds the key now; its row is not visible yet")
		return nil
	}
	w("created", stamp(rec.CreatedAt))
	w("completed", stamp(rec.CompletedAt))
	w("expires", stamp(rec.ExpiresAt))
	w("request hash", rec.RequestHash)
	w("result", fmt.Sprintf("%d bytes", len(rec.Result)))
	if rec.Refusal != nil {
		w("refusal", fmt.Sprintf("%s: %s (status %d)", rec.Refusal.Code, rec.Refusal.Message, rec.Refusal.Status))
	}
	return nil
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}
