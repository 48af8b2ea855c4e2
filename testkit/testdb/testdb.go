// Package testdb gives each test its own PostgreSQL database, cloned from a
// template that holds idem's schema, so tests run in parallel and never see
// each other's keys.
//
// The server is found once per test process, in this order:
//  1. IDEM_TEST_DATABASE_URL, then DATABASE_URL (any database on the server;
//     the role must be allowed to create databases);
//  2. a server on 127.0.0.1:5432, user postgres, trust authentication;
//  3. a postgres container, when a Docker engine answers: started by the
//     command tools/pgcontainer of the repository's tools module (with
//     testcontainers-go, which thus stays out of the library's go.mod), run
//     with `go run` and stopped when this test process ends;
//
// and otherwise the test fails with instructions. Describe says which it will be.
//
// IDEM_TEST_ADMIN_URL, when set, is where databases are created and dropped,
// while tests connect through IDEM_TEST_DATABASE_URL with the database name
// replaced. Set both to run the tests through a pooler such as PgBouncer in
// transaction mode, which cannot carry the harness's session advisory lock
// and whose idle server connections would block ALTER DATABASE.
//
// A failed test's database is kept, and its URL logged, so that its rows can
// be inspected; URL states what happens at the end of a test, and Main does
// the same for the database it gives a package in DATABASE_URL.
//
// This package is kept rather than replaced by github.com/peterldowns/pgtestdb
// (v0.1.1 evaluated), whose ideas it borrows: a template per schema hash, and
// a failed test's database kept with its URL logged. pgtestdb works through
// database/sql with a driver name and host/port fields, creates a role of its
// own and needs a testing.TB, and it neither finds a server nor takes an admin
// URL for poolers, so the code around it would be about as large as this
// package.
package testdb

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemhq/idem/schema"
	"github.com/idemhq/idem/testkit/pgurl"
)

// LocalURL is the server tried when no URL is set in the environment.
const LocalURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	once      sync.Once
	serverURL string // the maintenance database on the resolved server
	adminURL  string // where databases are created: IDEM_TEST_ADMIN_URL or serverURL
	pooled    bool   // IDEM_TEST_ADMIN_URL is set: tests connect through a pooler
	template  string
	resolved  error
	container *exec.Cmd // tools/pgcontainer, when it was started
	stopper   *os.File  // its standard input, open while the tests run
	counter   atomic.Int64
)

func resolve() error {
	once.Do(func() {
		resolved = doResolve()
		if resolved == nil {
			resolved = makeTemplate()
		}
		if resolved == nil {
			sweep(time.Now())
		}
	})
	return resolved
}

func doResolve() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u, err := resolveServer(ctx, LocalURL)
	if err != nil {
		return err
	}
	serverURL = u
	adminURL = serverURL
	if u := os.Getenv("IDEM_TEST_ADMIN_URL"); u != "" {
		if err := ping(ctx, u); err != nil {
			return fmt.Errorf("IDEM_TEST_ADMIN_URL is set but its server does not answer: %w", err)
		}
		adminURL = u
		pooled = true
	}
	return nil
}

// resolveServer finds the server: the environment's URL, local, or a
// container.
func resolveServer(ctx context.Context, local string) (string, error) {
	for _, env := range []string{"IDEM_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(env); u != "" {
			if err := ping(ctx, u); err != nil {
				return "", fmt.Errorf("%s is set but its server does not answer: %w", env, err)
			}
			return u, nil
		}
	}
	if err := ping(ctx, local); err == nil {
		return local, nil
	}
	u, err := startContainer(ctx)
	if err != nil {
		return "", fmt.Errorf("no PostgreSQL for the tests: set IDEM_TEST_DATABASE_URL, "+
			"or run `make test` (it starts or installs a local server), "+
			"or start a Docker engine for the container fallback: %w", err)
	}
	return u, nil
}

// containerWait bounds the wait for tools/pgcontainer's URL: building it
// and pulling the image on a cold cache take minutes.
const containerWait = 3 * time.Minute

// toolsDir returns the repository's tools module, found from this file's
// location, or an error if this package was not built from a checkout.
func toolsDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the source of testkit/testdb")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "..", "tools")
	if _, err := os.Stat(filepath.Join(dir, "pgcontainer", "main.go")); err != nil {
		return "", fmt.Errorf("no container fallback outside a checkout of the repository (%s not found)", filepath.Join(dir, "pgcontainer"))
	}
	return dir, nil
}

// startContainer runs tools/pgcontainer and returns the URL it prints. Its
// standard input is a pipe whose write end this process keeps open, so the
// container is terminated when this process ends, however it ends; Main
// closes it earlier, and waits.
func startContainer(ctx context.Context) (string, error) {
	dir, err := toolsDir()
	if err != nil {
		return "", err
	}
	stdin, w, err := os.Pipe()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "run", "./pgcontainer") //nolint:noctx // it outlives ctx: it serves the whole test process
	cmd.Dir = dir
	cmd.Stdin = stdin
	stderr := &tail{}
	cmd.Stderr = stderr
	// The built program shares stderr with go run: do not wait for it to
	// close it when go run has been killed.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		stdin.Close()
		w.Close()
		return "", err
	}
	if err := cmd.Start(); err != nil {
		stdin.Close()
		w.Close()
		return "", err
	}
	stdin.Close() // the child holds its own copy
	found := make(chan string, 1)
	go func() {
		defer close(found)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "postgres://") || strings.HasPrefix(line, "postgresql://") {
				found <- line
				return
			}
		}
	}()
	timer := time.NewTimer(containerWait)
	defer timer.Stop()
	fail := func(why string) (string, error) {
		w.Close() // pgcontainer stops on end of input
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return "", fmt.Errorf("go run ./pgcontainer in %s: %s: %s", dir, why, stderr.String())
	}
	select {
	case u, ok := <-found:
		if !ok {
			return fail("exited without a URL")
		}
		if err := waitReady(ctx, u); err != nil {
			return fail(err.Error())
		}
		container, stopper = cmd, w
		return u, nil
	case <-timer.C:
		return fail(fmt.Sprintf("no URL within %v", containerWait))
	}
}

// waitReady pings the container's server until it answers, briefly: the
// wait strategy of pgcontainer has already seen it ready.
func waitReady(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for {
		err := ping(ctx, u)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("its server does not answer: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stopContainer closes pgcontainer's standard input, which makes it
// terminate the container, and waits for it.
func stopContainer() {
	if container == nil {
		return
	}
	stopper.Close()
	if err := container.Wait(); err != nil {
		fmt.Fprintln(os.Stderr, "testdb: tools/pgcontainer:", err)
	}
	container, stopper = nil, nil
}

// tail keeps the last few kilobytes written to it, for error messages.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if n := len(t.buf) - 4096; n > 0 {
		t.buf = t.buf[n:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

func ping(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// makeTemplate creates, once per schema version, a database holding the
// schema. Test processes race for it; an advisory lock orders them.
func makeTemplate() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	files, err := schema.Files()
	if err != nil {
		return err
	}
	h := sha256.New()
	for _, f := range files {
		h.Write([]byte(f.Name))
		h.Write([]byte(f.SQL))
	}
	template = "idem_tmpl_" + hex.EncodeToString(h.Sum(nil))[:12]

	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "select pg_advisory_lock(7306086, 1)"); err != nil {
		return err
	}
	defer admin.Exec(context.Background(), "select pg_advisory_unlock(7306086, 1)") //nolint:errcheck // closing anyway
	var exists bool
	if err := admin.QueryRow(ctx, "select exists (select 1 from pg_database where datname = $1 and datistemplate)", template).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	building := template + "_build"
	if _, err := admin.Exec(ctx, "drop database if exists "+building+" with (force)"); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "create database "+building); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, pgurl.WithDatabase(adminURL, building))
	if err != nil {
		return err
	}
	err = schema.Apply(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		return err
	}
	for _, q := range []string{
		"alter database " + building + " rename to " + template,
		"alter database " + template + " is_template true",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// URL returns the URL of a new, empty-but-migrated database for t.
//
// When t ends, the database is dropped if t passed. Sessions still connected
// to it then (PostgreSQL waits up to 5 seconds for closing ones to end) are
// leaked connections: URL reports them as an error of t, with their
// application_name and state, and ends them. Behind a pooler
// (IDEM_TEST_ADMIN_URL), whose idle server sessions are expected, they are
// ended without a report.
//
// If t failed, the database is kept for inspection, and t logs its URL
// (without password) and a psql command that opens it. A test process that
// starts more than 24 hours later drops it; a container started by
// tools/pgcontainer takes its databases with it at the end of the run.
func URL(t testing.TB) string {
	t.Helper()
	name, u, err := create()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() { t.Helper(); finish(t, name, u) })
	return u
}

// Open returns a pool on a new database and a function that closes the pool
// and drops the database, reporting leaked connections on standard error:
// for programs, which have no testing.TB. Runnable examples need not call it:
// Main gives them a database in DATABASE_URL.
func Open() (*pgxpool.Pool, func(), error) {
	name, u, err := create()
	if err != nil {
		return nil, nil, err
	}
	done := func() {
		if err := drop(name); err != nil {
			fmt.Fprintln(os.Stderr, "testdb:", err)
		}
	}
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		done()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); done() }, nil
}

// create clones the template into a new database and returns its name and
// URL.
func create() (name, u string, err error) {
	if err := resolve(); err != nil {
		return "", "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", "", fmt.Errorf("connect: %w", err)
	}
	defer admin.Close(ctx)
	for range 10 {
		name = newName(time.Now())
		_, err = admin.Exec(ctx, "create database "+name+" template "+template)
		// A process on another host sharing the server may have the same pid
		// and count in the same second.
		if !hasCode(err, pgerrcode.DuplicateDatabase) {
			break
		}
	}
	if err != nil {
		return "", "", fmt.Errorf("create database: %w", err)
	}
	return name, pgurl.WithDatabase(serverURL, name), nil
}

// New returns a pool on a new database (see URL), closed when t ends. The
// configure functions may adjust the pool's configuration.
func New(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Main runs the tests of a package. Use it as the package's TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
//
// Before the tests, Main creates a database for the package, cloned from the
// template as URL's are, and sets DATABASE_URL to it, so that runnable
// examples get their database the way a user's program does:
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//
// The package's tests and examples share that database. After them, Main
// drops it, or keeps it and prints its URL if the run failed, and fails the
// run if connections to it leaked (see URL) or goroutines leaked. It stops
// the container if one was started.
func Main(m *testing.M) int {
	// create resolves the server, which may read DATABASE_URL, before it is
	// set here; resolution runs once per process, so later tests use the
	// same server.
	name, u, err := create()
	if err != nil {
		// The tests that need a database fail with this reason too.
		fmt.Fprintln(os.Stderr, "testdb:", err)
	} else {
		os.Setenv("DATABASE_URL", u)
	}
	code := m.Run()
	switch {
	case err != nil: // no database to drop
	case code != 0:
		fmt.Fprintf(os.Stderr, "testdb: kept the database of this failed run (DATABASE_URL): %s\n", inspect(u))
	default:
		if err := drop(name); err != nil {
			fmt.Fprintln(os.Stderr, "testdb:", err)
			code = 1
		}
	}
	stopContainer()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// HostPort returns the host:port of a database URL, for tests that put a
// proxy in front of it.
func HostPort(u string) (string, error) {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), nil
}

// WithHostPort returns u pointed at another host:port, e.g. a proxy.
func WithHostPort(u, hostport string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	p.Host = hostport
	if q := p.Query(); q.Has("host") || q.Has("port") {
		q.Del("host")
		q.Del("port")
		p.RawQuery = q.Encode()
	}
	return strings.TrimSuffix(p.String(), "?")
}

// Describe says which server the tests will use and its version, without
// starting a container: for `make test` to print before the tests run.
func Describe() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	version := func(u string) string {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			return ""
		}
		defer conn.Close(ctx)
		var v string
		if err := conn.QueryRow(ctx, "show server_version").Scan(&v); err != nil {
			return ""
		}
		return ", PostgreSQL " + v
	}
	for _, env := range []string{"IDEM_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(env); u != "" {
			return "$" + env + " (" + pgurl.Redact(u) + version(u) + ")"
		}
	}
	if v := version(LocalURL); v != "" {
		return "local server at 127.0.0.1:5432" + v
	}
	if _, err := toolsDir(); err != nil {
		return "none: no server on 127.0.0.1:5432, and " + err.Error() + "; set IDEM_TEST_DATABASE_URL"
	}
	return "postgres:16-alpine container started by tools/pgcontainer with testcontainers-go (no server on 127.0.0.1:5432; needs a Docker engine)"
}
