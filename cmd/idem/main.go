// Command idem runs the operations of an idem key table: create it, check
// that a service can use it, sweep expired keys, report on it, and show one
// key.
//
//	go run github.com/idemhq/idem/cmd/idem migrate [-table T] [-partitioned [-interval 24h]]
//	go run github.com/idemhq/idem/cmd/idem check [-table T]
//	go run github.com/idemhq/idem/cmd/idem sweep [-table T] [-every 1m]
//	go run github.com/idemhq/idem/cmd/idem stats [-table T]
//	go run github.com/idemhq/idem/cmd/idem count [-table T]
//	go run github.com/idemhq/idem/cmd/idem inspect [-table T] [-scope S] [-operation OP] [-key-file F] KEY
//	go run github.com/idemhq/idem/cmd/idem forget [-table T] [-scope S] [-operation OP] KEY
//
// The database is DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable, named on stderr
// when used; forget refuses to use it); over a network, give it
// sslmode=verify-full. Everything printed from the database is
// escaped for the terminal. Exit codes: 0 success, 1 failure, 2 usage
// error, 3 key not found (inspect).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/internal/httpenvelope"
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
  check     Check that a service can use the table (Client.Check): it
            exists with idem's columns and unique key, its layout is one
            idem works with, the role may write it, and the server is not
            read-only. Run it at deployment, with the service's own role.
  sweep     Remove expired keys once, or every -every (e.g. 1m) until
            interrupted. Plain table: batched DELETE. Partitioned table:
            make partitions ahead, drop those whose keys all expired, delete
            from the DEFAULT partition (or run pg_partman's maintenance if it
            manages the table). Prints how many keys it removed.
  stats     The table's health as a metrics scrape reads it (Client.Stats):
            estimated rows and live keys, keys in progress now and the
            oldest one's age, expired keys awaiting the sweeper (counted up
            to 100000), the table's size, and the operations made of steps
            that are unfinished and the oldest one's age. Never scans the
            table.
  count     Count the keys exactly: live, expired awaiting the sweeper, in
            progress now, the size of the table and of each partition.
            Reads the whole table: on a large table prefer stats.
  inspect   Show one key (Client.Lookup): status, times, request hash, the
            stored body (decoded and escaped) and refusal. -scope is the
            key's scope as stored (default empty); -operation names the
            Wrap operation that stored it (the scope is then Wrap's caller
            scope); -key-file opens a sealed row with the service's AES key.
            A response stored by idemhttp is shown as its status, headers
            and body.
  forget    Delete one key (Client.Forget), so that the next request with it
            runs again: for a deliberate reset, such as after a refund. What
            the key recorded is not undone: a retry does it again. -scope
            and -operation as for inspect. A key in progress is left alone
            (exit 1); a key not found exits 3. Needs DATABASE_URL.

Flags of every command:
  -table            the key table, optionally schema-qualified (default idempotency_keys)
  -connect-timeout  the bound of each connection attempt (default 10s; a
                    connect_timeout in DATABASE_URL applies when this flag
                    is not given)

Environment:
  DATABASE_URL   the database (default ` + DefaultURL + `,
                 the local development server: idem names it on stderr
                 when it uses it, so that no command acts on a database
                 that was not meant silently; forget, which deletes a
                 key that may still be needed, refuses to run without
                 DATABASE_URL rather than guess).
                 Over a network, use TLS that checks the server:
                 postgres://user:password@host/db?sslmode=verify-full&sslrootcert=ca.pem
                 Without sslmode, pgx uses sslmode=prefer, which falls back to
                 no TLS: a server that declines TLS can then ask for the
                 password in clear. idem warns when a password may travel so.

Everything printed from the database (bodies, refusals, names, the server's
error messages) is escaped: control characters show as \x1b, \n, \u202e.

Exit codes: 0 success, 1 failure, 2 usage error, 3 key not found (inspect,
forget).
Run "idem <command> -h" for a command's flags.
`

// commands are the subcommands and the arguments each takes, for their
// usage lines.
var commands = map[string]string{
	"migrate": "",
	"check":   "",
	"sweep":   "",
	"stats":   "",
	"count":   "",
	"inspect": "KEY",
	"forget":  "KEY",
}

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
	operands, known := commands[cmd]
	if !known {
		fmt.Fprintf(stderr, "idem: unknown command %s\n\n%s", strconv.Quote(cmd), usage)
		return exitUsage
	}
	fs := flag.NewFlagSet("idem "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	table := fs.String("table", idem.DefaultTable, "the key table, optionally schema-qualified")
	connectTimeout := fs.Duration("connect-timeout", DefaultConnectTimeout, "the bound of each connection attempt; when not given, DATABASE_URL's connect_timeout applies if it has one")
	var (
		partitioned *bool
		interval    *time.Duration
		every       *time.Duration
		scope       *string
		operation   *string
		keyFile     *string
	)
	switch cmd {
	case "migrate":
		partitioned = fs.Bool("partitioned", false, "create the partitioned layout")
		interval = fs.Duration("interval", schema.DefaultPartitionInterval, "partition interval with -partitioned (whole seconds, at least 1s)")
	case "sweep":
		every = fs.Duration("every", 0, "sweep every interval until interrupted (0: once)")
	case "inspect", "forget":
		scope = fs.String("scope", "", "the key's scope, as stored; with -operation, the caller's scope given to Wrap")
		operation = fs.String("operation", "", "the operation of idem.Wrap that stored the key")
	}
	if cmd == "inspect" {
		keyFile = fs.String("key-file", "", "a file holding the AES key of the service's idem.NewAEADSealer (AES-GCM; hex, base64 or raw; 16, 24 or 32 bytes), to open sealed rows")
	}
	fs.Usage = func() {
		line := "usage: idem " + cmd + " [flags]"
		if operands != "" {
			line += " " + operands
		}
		fmt.Fprintln(stderr, line)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	switch {
	case operands == "KEY" && fs.NArg() != 1:
		fmt.Fprintf(stderr, "idem %s: want exactly one KEY\n", cmd)
		fs.Usage()
		return exitUsage
	case operands == "" && fs.NArg() != 0:
		say(stderr, "idem %s: unexpected arguments %q", cmd, fs.Args())
		fs.Usage()
		return exitUsage
	case cmd == "migrate" && !*partitioned && isSet(fs, "interval"):
		fmt.Fprintln(stderr, "idem migrate: -interval needs -partitioned")
		return exitUsage
	case every != nil && *every < 0:
		fmt.Fprintln(stderr, "idem sweep: -every must not be negative")
		return exitUsage
	case *connectTimeout <= 0:
		fmt.Fprintf(stderr, "idem %s: -connect-timeout must be positive\n", cmd)
		return exitUsage
	}

	cfg := &idem.Config{Table: *table}
	storedScope := ""
	if scope != nil {
		storedScope = *scope
		if *operation != "" {
			s, err := idem.WrapScope(*operation, *scope)
			if err != nil {
				say(stderr, "idem %s: %s", cmd, strings.TrimPrefix(err.Error(), "idem: "))
				return exitUsage
			}
			storedScope = s
		}
	}
	if keyFile != nil {
		if *keyFile != "" {
			sl, err := loadSealer(*keyFile)
			if err != nil {
				say(stderr, "idem inspect: %s", err)
				return exitUsage
			}
			cfg.Sealer = sl
		}
	}

	url := getenv("DATABASE_URL")
	if url == "" {
		if cmd == "forget" {
			say(stderr, "idem forget: DATABASE_URL is not set: set it to the database whose key to forget (forget never uses the default, %s)", DefaultURL)
			return exitUsage
		}
		say(stderr, "idem: DATABASE_URL is not set; using %s", DefaultURL)
		url = DefaultURL
	}
	pool, err := connect(ctx, url, *connectTimeout, isSet(fs, "connect-timeout"), stderr)
	if err != nil {
		say(stderr, "idem: %s", err)
		return exitFailure
	}
	defer pool.Close()
	keys, err := idem.NewClient(pool, cfg)
	if err != nil {
		say(stderr, "idem: %s", err)
		return exitUsage
	}

	switch cmd {
	case "migrate":
		err = migrate(ctx, pool, *table, *partitioned, *interval, stdout)
	case "check":
		err = check(ctx, pool, keys, stdout)
	case "sweep":
		err = sweep(ctx, keys, *every, stdout, stderr)
	case "stats":
		err = stats(ctx, keys, stdout)
	case "count":
		err = count(ctx, pool, *table, stdout)
	case "inspect":
		err = inspect(ctx, keys, storedScope, fs.Arg(0), *keyFile != "", stdout)
	case "forget":
		err = forget(ctx, keys, storedScope, fs.Arg(0), stdout)
	}
	if errors.Is(err, idem.ErrNotFound) {
		say(stderr, "idem %s: no key %q in scope %q in %s", cmd, fs.Arg(0), storedScope, keys.Table())
		if *operation == "" {
			say(stderr, "keys stored through idemhttp, idemgrpc or a scope in the context live in that scope: pass -scope; keys stored by idem.Wrap also need -operation")
		}
		return exitNotFound
	}
	if err != nil {
		// Check names every problem it found, one error each: one line each.
		problems := []error{err}
		if joined, ok := err.(interface{ Unwrap() []error }); ok {
			problems = joined.Unwrap()
		}
		for _, p := range problems {
			say(stderr, "idem %s: %s", cmd, strings.TrimPrefix(p.Error(), "idem: "))
		}
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
		say(stdout, "%s: partitioned by created_at", table)
		return nil
	}
	if err := schema.ApplyTable(ctx, pool, table); err != nil {
		return err
	}
	say(stdout, "%s: ready", table)
	return nil
}

func check(ctx context.Context, pool *pgxpool.Pool, keys *idem.Client, stdout io.Writer) error {
	if err := keys.Check(ctx); err != nil {
		return err
	}
	var partitioned bool
	if err := pool.QueryRow(ctx, "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)", keys.Table()).Scan(&partitioned); err != nil {
		return err
	}
	layout := "plain"
	if partitioned {
		layout = "partitioned"
	}
	say(stdout, "%s: ready (%s layout; this role may read and write it)", keys.Table(), layout)
	return nil
}

func sweep(ctx context.Context, keys *idem.Client, every time.Duration, stdout, stderr io.Writer) error {
	once := func() error {
		n, err := keys.Sweep(ctx)
		if err != nil {
			return err
		}
		say(stdout, "%s %s: removed %d expired keys", time.Now().UTC().Format(time.RFC3339), keys.Table(), n)
		return nil
	}
	if every == 0 {
		return once()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// A failed sweep is reported and retried at the next tick, as
		// Client.SweepEvery does.
		if err := once(); err != nil && ctx.Err() == nil {
			say(stderr, "idem sweep: %s", strings.TrimPrefix(err.Error(), "idem: "))
		}
		select {
		case <-ctx.Done():
			return nil // interrupted: a normal end
		case <-t.C:
		}
	}
}

func inspect(ctx context.Context, keys *idem.Client, scope, key string, haveKey bool, stdout io.Writer) error {
	rec, err := keys.Lookup(ctx, scope, key)
	if err != nil {
		return err
	}
	w := func(name, format string, args ...any) {
		say(stdout, "%-13s "+format, append([]any{name + ":"}, args...)...)
	}
	w("key", "%q", rec.Key)
	w("scope", "%q", rec.Scope)
	status := string(rec.Status)
	if rec.Status != idem.StatusInProgress && rec.Expired(time.Now()) {
		status += " (expired, awaiting the sweeper)"
	}
	w("status", "%s", status)
	if rec.Status == idem.StatusInProgress && rec.CreatedAt.IsZero() {
		w("note", "a transaction holds the key now; its row is not visible yet")
		return nil
	}
	w("created", "%s", stamp(rec.CreatedAt))
	w("completed", "%s", stamp(rec.CompletedAt))
	w("expires", "%s", stamp(rec.ExpiresAt))
	w("request hash", "%s", rec.RequestHash)
	if rec.Status == idem.StatusInProgress {
		return nil // committed without completing: it holds no result
	}
	if rec.Sealed {
		hint := "pass -key-file with the service's AES key to open it"
		if haveKey {
			hint = "the key file does not open it"
		}
		w("result", "sealed (%s)", hint)
		return nil
	}
	if rec.Refusal != nil {
		// A refused call stores its result type's zero value: nothing to show.
		w("refusal", "%s: %s (status %d)", rec.Refusal.Code, rec.Refusal.Message, rec.Refusal.Status)
		return nil
	}
	w("result", "%d bytes", len(rec.Result))
	if resp, ok := httpResponse(rec.Result); ok {
		w("response", "%d %s (stored by idemhttp)", resp.Status, http.StatusText(resp.Status))
		for _, name := range slices.Sorted(maps.Keys(resp.Header)) {
			for _, v := range resp.Header[name] {
				w("header", "%s: %s", name, v)
			}
		}
		w("body", "%s", body(resp.Body))
		return nil
	}
	w("body", "%s", body(rec.Result))
	return nil
}

// httpResponse decodes a result that idemhttp stored: an HTTP response in
// its binary envelope. JSON, what Do stores for most types, is never one.
func httpResponse(b []byte) (httpenvelope.Response, bool) {
	var resp httpenvelope.Response
	if json.Valid(b) || resp.UnmarshalBinary(b) != nil {
		return resp, false
	}
	return resp, true
}

// forget deletes the key; a key that holds nothing is ErrNotFound.
func forget(ctx context.Context, keys *idem.Client, scope, key string, stdout io.Writer) error {
	deleted, err := keys.Forget(ctx, scope, key)
	switch {
	case errors.Is(err, idem.ErrInProgress):
		return fmt.Errorf("key %q is in progress now: a call or an operation's step holds it; left alone, look again later: %w", key, err)
	case err != nil:
		return err
	case !deleted:
		return idem.ErrNotFound
	}
	say(stdout, "%s: forgot key %q in scope %q; the next request with it runs again", keys.Table(), key, scope)
	return nil
}

// body shows a stored result: JSON as stored, any other form (a type's
// MarshalBinary) quoted; say escapes either for the terminal.
func body(b []byte) string {
	switch {
	case len(b) == 0:
		return "(empty)"
	case json.Valid(b):
		return string(b)
	}
	return "binary " + strconv.QuoteToGraphic(string(b))
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}
