package testdb

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/testkit/pgurl"
)

// recorder is a testing.TB that records what the harness reports and runs
// the cleanups when told, so that a test can watch the harness fail a test
// without failing itself. The methods it does not define go to the real
// test.
type recorder struct {
	testing.TB
	failed   bool
	logs     []string
	errs     []string
	cleanups []func()
}

func (*recorder) Helper()            {}
func (r *recorder) Failed() bool     { return r.failed || len(r.errs) > 0 }
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// end runs the cleanups, the last registered first, as testing does when a
// test ends.
func (r *recorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// databaseOf returns the database name in u.
func databaseOf(t *testing.T, u string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

// admin returns a connection to the server's maintenance database, closed
// when t ends.
func admin(t *testing.T) *pgx.Conn {
	t.Helper()
	if err := resolve(); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), adminURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// exists reports whether database name exists.
func exists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	var ok bool
	if err := conn.QueryRow(context.Background(), "select exists (select from pg_database where datname = $1)", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestPassingTestDropsItsDatabase(t *testing.T) {
	t.Parallel()
	rec := &recorder{TB: t}
	pool := New(rec)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	name := pool.Config().ConnConfig.Database
	rec.end()
	if len(rec.errs) > 0 || len(rec.logs) > 0 {
		t.Fatalf("a passing test with its pool closed: errors %q, logs %q", rec.errs, rec.logs)
	}
	if exists(t, admin(t), name) {
		t.Fatalf("database %s of a passing test was kept", name)
	}
}

func TestFailedTestKeepsItsDatabase(t *testing.T) {
	t.Parallel()
	rec := &recorder{TB: t, failed: true}
	u := URL(rec)
	name := databaseOf(t, u)
	rec.end()
	t.Cleanup(func() {
		if err := drop(name); err != nil {
			t.Error(err)
		}
	})
	if !exists(t, admin(t), name) {
		t.Fatalf("database %s of a failed test was dropped", name)
	}
	if len(rec.logs) != 1 || !strings.Contains(rec.logs[0], u) || !strings.Contains(rec.logs[0], "psql '"+u+"'") {
		t.Fatalf("logs %q: want one with URL %s and a psql command", rec.logs, u)
	}
}

// A connection left open when the test ends is reported, and ended so that
// the database can be dropped.
func TestLeakedConnectionIsReported(t *testing.T) {
	t.Parallel()
	if err := resolve(); err != nil {
		t.Fatal(err)
	}
	if pooled {
		t.Skip("behind a pooler (IDEM_TEST_ADMIN_URL), server sessions are not counted as leaks")
	}
	ctx := context.Background()
	rec := &recorder{TB: t}
	u := URL(rec)
	name := databaseOf(t, u)
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "leaky"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx) // the client side; the harness ended the session

	rec.end()
	if len(rec.errs) != 1 {
		t.Fatalf("errors %q: want one reporting the leaked connection", rec.errs)
	}
	for _, want := range []string{name, "1 leaked connection", `application_name "leaky"`} {
		if !strings.Contains(rec.errs[0], want) {
			t.Errorf("error %q does not say %q", rec.errs[0], want)
		}
	}
	if exists(t, admin(t), name) {
		t.Fatalf("database %s with a leaked connection was not dropped", name)
	}
}

func TestCreatedAt(t *testing.T) {
	t.Parallel()
	now := time.Unix(1767225600, 0)
	cases := []struct {
		name string
		want time.Time
		ok   bool
	}{
		{newName(now), now, true},
		{"idem_test_1767225600_4242_7", now, true},
		{"idem_test_4242_123456_7", time.Time{}, false}, // earlier form: pid first
		{"idem_test_x_4242_7", time.Time{}, false},
		{"idem_test_1767225600", time.Time{}, false},
		{"idem_tmpl_0123456789ab", time.Time{}, false},
		{"postgres", time.Time{}, false},
	}
	for _, c := range cases {
		if got, ok := createdAt(c.name); !got.Equal(c.want) || ok != c.ok {
			t.Errorf("createdAt(%q) = %v, %t; want %v, %t", c.name, got, ok, c.want, c.ok)
		}
	}
}

// sweep drops kept databases older than a day, but not younger ones, nor one
// that someone is connected to.
func TestSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := admin(t)
	now := time.Now()
	create := func(name string) {
		if _, err := a.Exec(ctx, "create database "+name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = a.Exec(ctx, "drop database if exists "+name+" with (force)") })
	}
	old, young := newName(now.Add(-keepFor-time.Hour)), newName(now.Add(-time.Hour))
	create(old)
	create(young)
	// Another test process's sweep at its start may drop an old database
	// between its creation and the session that keeps it: take another.
	var inUse string
	var conn *pgx.Conn
	for {
		inUse = newName(now.Add(-keepFor - time.Hour))
		create(inUse)
		var err error
		if conn, err = pgx.Connect(ctx, pgurl.WithDatabase(adminURL, inUse)); err == nil {
			break
		} else if !hasCode(err, "3D000") { // invalid_catalog_name
			t.Fatal(err)
		}
	}
	defer conn.Close(ctx)

	sweep(now)
	for name, want := range map[string]bool{old: false, inUse: true, young: true} {
		if got := exists(t, a, name); got != want {
			t.Errorf("after sweep, database %s exists: %t, want %t", name, got, want)
		}
	}
}
