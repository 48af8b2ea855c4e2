// Package testdb gives each test its own PostgreSQL database, cloned from a
// template that holds idem's schema, so tests run in parallel and never see
// each other's keys.
//
// The server is found once per test process, in this order:
//  1. IDEM_TEST_DATABASE_URL, then DATABASE_URL (any database on the server;
//     the role must be allowed to create databases);
//  2. a server on 127.0.0.1:5432, user postgres, trust authentication;
//  3. a postgres container started with testcontainers-go, when a Docker
//     engine answers;
//
// and otherwise the test fails with instructions. Describe says which it will be.
//
// IDEM_TEST_ADMIN_URL, when set, is where databases are created and dropped,
// while tests connect through IDEM_TEST_DATABASE_URL with the database name
// replaced. Set both to run the tests through a pooler such as PgBouncer in
// transaction mode, which cannot carry the harness's session advisory lock
// and whose idle server connections would block ALTER DATABASE.
package testdb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"go.uber.org/goleak"

	"github.com/idemhq/idem/internal/pgurl"
	"github.com/idemhq/idem/schema"
)

// LocalURL is the server tried when no URL is set in the environment.
const LocalURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	once      sync.Once
	serverURL string // the maintenance database on the resolved server
	adminURL  string // where databases are created: IDEM_TEST_ADMIN_URL or serverURL
	template  string
	resolved  error
	container testcontainers.Container
	counter   atomic.Int64
)

func resolve() error {
	once.Do(func() {
		resolved = doResolve()
		if resolved == nil {
			resolved = makeTemplate()
		}
	})
	return resolved
}

func doResolve() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := resolveServer(ctx); err != nil {
		return err
	}
	adminURL = serverURL
	if u := os.Getenv("IDEM_TEST_ADMIN_URL"); u != "" {
		if err := ping(ctx, u); err != nil {
			return fmt.Errorf("IDEM_TEST_ADMIN_URL is set but its server does not answer: %w", err)
		}
		adminURL = u
	}
	return nil
}

func resolveServer(ctx context.Context) error {
	for _, env := range []string{"IDEM_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(env); u != "" {
			if err := ping(ctx, u); err != nil {
				return fmt.Errorf("%s is set but its server does not answer: %w", env, err)
			}
			serverURL = u
			return nil
		}
	}
	if err := ping(ctx, LocalURL); err == nil {
		serverURL = LocalURL
		return nil
	}
	u, err := startContainer(ctx)
	if err != nil {
		return errors.New("no PostgreSQL for the tests: set IDEM_TEST_DATABASE_URL, " +
			"or run `make test` (it starts or installs a local server), " +
			"or start a Docker engine for testcontainers-go (" + err.Error() + ")")
	}
	serverURL = u
	return nil
}

func startContainer(ctx context.Context) (u string, err error) {
	defer func() {
		// testcontainers panics in some set-ups without a Docker engine.
		if r := recover(); r != nil {
			err = fmt.Errorf("docker: %v", r)
		}
	}()
	provider, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return "", err
	}
	defer provider.Close()
	if err := provider.Health(ctx); err != nil {
		return "", err
	}
	c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return "", err
	}
	container = c
	return c.ConnectionString(ctx, "sslmode=disable")
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

// URL returns the URL of a new, empty-but-migrated database that is dropped
// when t ends.
func URL(t testing.TB) string {
	t.Helper()
	u, drop, err := create()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("testdb: %v", err)
		}
	})
	return u
}

// Open returns a pool on a new database and a function that closes the pool
// and drops the database: for runnable examples and programs, which have no
// testing.TB.
func Open() (*pgxpool.Pool, func(), error) {
	u, drop, err := create()
	if err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		_ = drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); _ = drop() }, nil
}

// create clones the template into a new database.
func create() (string, func() error, error) {
	if err := resolve(); err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("idem_test_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6, counter.Add(1))
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect: %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "create database "+name+" template "+template); err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "drop database if exists "+name+" with (force)"); err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
		return nil
	}
	return pgurl.WithDatabase(serverURL, name), drop, nil
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

// Main runs the tests of a package, stops the container if one was started,
// and fails the run if goroutines leaked. Use it as a package's TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	if container != nil {
		_ = testcontainers.TerminateContainer(container)
	}
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
	return "testcontainers-go postgres:16-alpine container (no server on 127.0.0.1:5432; needs a Docker engine)"
}
