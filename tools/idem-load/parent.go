package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/idemhq/idem/testkit/pgurl"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/schema"
)

// localURL is the server used when no URL is set in the environment, as in
// the tests.
const localURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ledgerSQL is the business table. idem_key is deliberately not unique: a
// key committed twice must show up as two rows, not as a constraint error.
const ledgerSQL = `CREATE TABLE ledger (
    id       bigserial PRIMARY KEY,
    idem_key text   NOT NULL,
    amount   bigint NOT NULL
)`

// runParent creates the database, runs the workers, reconciles and reports.
// It returns the exit status.
func runParent(p plan, keep bool) int {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout+time.Minute)
	defer cancel()
	serverURL, adminURL := serverURLs()
	name := fmt.Sprintf("idem_load_%d", os.Getpid())
	dbURL, drop, err := createDatabase(ctx, adminURL, serverURL, name, ledgerSQL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-load:", err)
		return 1
	}
	if keep {
		fmt.Fprintf(os.Stderr, "idem-load: keeping database %s\n", name)
	} else {
		defer drop()
	}
	dir, err := os.MkdirTemp("", "idem-load-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-load:", err)
		return 1
	}
	defer os.RemoveAll(dir)

	fmt.Printf("idem-load: %d processes x (%d clients + %d racers) = %d clients, %d calls scheduled, seed %d, database %s\n",
		p.workers, p.clients, p.raceWidth, p.workers*(p.clients+p.raceWidth), p.ops, p.seed, name)
	began := time.Now()
	files, err := runWorkers(ctx, p, dbURL, dir)
	elapsed := time.Since(began)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-load:", err)
		return 1
	}
	fig, err := reconcile(ctx, p, dbURL, files)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-load: reconcile:", err)
		return 1
	}
	fig.elapsed = elapsed
	fig.print(os.Stdout, p)
	if len(fig.violations) > 0 || fig.errors > 0 {
		return 1
	}
	return 0
}

// serverURLs returns the server the load uses (IDEM_TEST_DATABASE_URL,
// DATABASE_URL, or the local server) and the URL to create databases
// through (IDEM_TEST_ADMIN_URL, or the same).
func serverURLs() (serverURL, adminURL string) {
	serverURL = localURL
	for _, env := range []string{"IDEM_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(env); u != "" {
			serverURL = u
			break
		}
	}
	adminURL = serverURL
	if u := os.Getenv("IDEM_TEST_ADMIN_URL"); u != "" {
		adminURL = u
	}
	return serverURL, adminURL
}

// createDatabase creates a database holding idem's schema and the business
// tables of businessSQL through adminURL, and returns its URL on serverURL's
// server (a pooler in front of the same server, say) and a function that
// drops it.
func createDatabase(ctx context.Context, adminURL, serverURL, name, businessSQL string) (string, func(), error) {
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to %s: %w", pgurl.Redact(adminURL), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, err
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, adminURL)
		if err == nil {
			_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			admin.Close(ctx)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "idem-load: drop database %s: %v\n", name, err)
		}
	}
	conn, err := pgx.Connect(ctx, pgurl.WithDatabase(adminURL, name))
	if err == nil {
		err = schema.Apply(ctx, conn)
		if err == nil {
			_, err = conn.Exec(ctx, businessSQL)
		}
		conn.Close(ctx)
	}
	if err != nil {
		drop()
		return "", nil, fmt.Errorf("prepare %s: %w", name, err)
	}
	return pgurl.WithDatabase(serverURL, name), drop, nil
}

// runWorkers starts the worker processes, runs the race barrier between
// them, and returns their answer files once all have exited.
func runWorkers(ctx context.Context, p plan, dbURL, dir string) ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		cmds  []*exec.Cmd
		ins   []io.WriteCloser
		outs  []*bufio.Scanner
		files []string
	)
	for w := range p.workers {
		file := filepath.Join(dir, "worker-"+strconv.Itoa(w)+".tsv")
		args := append([]string{
			"-worker=" + strconv.Itoa(w), "-worker-url=" + dbURL, "-worker-out=" + file,
		}, os.Args[1:]...)
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		cmds, ins, files = append(cmds, cmd), append(ins, in), append(files, file)
		outs = append(outs, bufio.NewScanner(out))
	}

	// The barrier: race r starts when every worker's racers are ready for it.
	var barrierErr error
	for r := range p.races() {
		for w, out := range outs {
			if !out.Scan() {
				barrierErr = fmt.Errorf("worker %d left before race %d", w, r)
				break
			}
			if got, want := out.Text(), fmt.Sprintf("ready %d", r); got != want {
				barrierErr = fmt.Errorf("worker %d said %q, want %q", w, got, want)
				break
			}
		}
		if barrierErr != nil {
			cancel() // stop the others: the run is void
			break
		}
		for _, in := range ins {
			fmt.Fprintf(in, "go %d\n", r)
		}
	}
	var errs []error
	for w, cmd := range cmds {
		ins[w].Close()
		if err := cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("worker %d: %w", w, err))
		}
	}
	if barrierErr != nil {
		errs = append([]error{barrierErr}, errs...)
	}
	return files, errors.Join(errs...)
}
