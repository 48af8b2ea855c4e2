package testdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/testkit/pgurl"
)

// namePrefix starts the name of every database the harness gives out.
const namePrefix = "idem_test_"

// keepFor is how long a failed test's database is kept before a later test
// process drops it.
const keepFor = 24 * time.Hour

// newName returns the name of a new database: idem_test_<unix
// seconds>_<pid>_<count>. pg_database records no creation time, so the name
// carries it, for sweep.
func newName(now time.Time) string {
	return fmt.Sprintf("%s%d_%d_%d", namePrefix, now.Unix(), os.Getpid(), counter.Add(1))
}

// createdAt returns the creation time carried by a database name of
// newName's form. It reports false for other names, among them those of the
// harness's earlier form, idem_test_<pid>_..., whose first number is a pid
// (below 2^22), not a time.
func createdAt(name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, namePrefix)
	if !ok {
		return time.Time{}, false
	}
	first, _, ok := strings.Cut(rest, "_")
	sec, err := strconv.ParseInt(first, 10, 64)
	if !ok || err != nil || sec < 1e9 {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

// finish ends the database of a test, as URL documents: kept and logged if t
// failed, dropped otherwise.
func finish(t testing.TB, name, u string) {
	t.Helper()
	if t.Failed() {
		t.Logf("testdb: kept the database of this failed test: %s", inspect(u))
		return
	}
	if err := drop(name); err != nil {
		t.Errorf("testdb: %v", err)
	}
}

// inspect returns u without its password, and a psql command that opens it.
func inspect(u string) string {
	u = pgurl.WithoutPassword(u)
	return u + "\n\tinspect it with: psql '" + strings.ReplaceAll(u, "'", `'\''`) + "'"
}

// drop drops the database name. Sessions still connected to it are leaked
// connections: drop ends them, so that the run goes on, and returns an error
// that describes them.
func drop(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("drop %s: %w", name, err)
	}
	defer admin.Close(ctx)
	var leak error
	// Behind a pooler, the pooler's idle server sessions on the database are
	// expected and cannot be told from leaked ones.
	if !pooled {
		// Without FORCE, DROP DATABASE waits up to 5 seconds for other
		// sessions to end: a connection closed just before the drop leaves a
		// backend that exits a moment later, and is no leak.
		_, err := admin.Exec(ctx, "drop database if exists "+name)
		switch {
		case err == nil:
			return nil
		case !hasCode(err, pgerrcode.ObjectInUse):
			return fmt.Errorf("drop %s: %w", name, err)
		}
		leak = leaked(ctx, admin, name)
	}
	if _, err := admin.Exec(ctx, "drop database if exists "+name+" with (force)"); err != nil {
		return errors.Join(leak, fmt.Errorf("drop %s: %w", name, err))
	}
	return leak
}

// leaked describes the client sessions still connected to database name.
func leaked(ctx context.Context, admin *pgx.Conn, name string) error {
	rows, _ := admin.Query(ctx, `
		select coalesce(application_name, ''), coalesce(state, '')
		from pg_stat_activity
		where datname = $1 and backend_type = 'client backend'`, name)
	sessions, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var app, state string
		err := row.Scan(&app, &state)
		return fmt.Sprintf("application_name %q, state %q", app, state), err
	})
	if err != nil {
		return fmt.Errorf("database %s: sessions still connected after use (leaked connections), and listing them failed: %w", name, err)
	}
	return fmt.Errorf("database %s: %d leaked connection(s), still connected after use [%s]; dropping it WITH (FORCE)",
		name, len(sessions), strings.Join(sessions, "; "))
}

// sweep drops the databases kept longer than keepFor, so that failed runs do
// not pile up databases on a developer's server or a CI's. It is best effort:
// a database it cannot drop (another role's, say) stays, and so does one with
// a session, which someone is inspecting.
func sweep(now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	rows, _ := admin.Query(ctx, `
		select datname from pg_database d
		where datname like $1 and not datistemplate
		  and not exists (select from pg_stat_activity a where a.datname = d.datname)`,
		strings.ReplaceAll(namePrefix, "_", `\_`)+"%")
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		if at, ok := createdAt(name); ok && now.Sub(at) > keepFor {
			// Without FORCE: a session opened since the query keeps it.
			_, _ = admin.Exec(ctx, "drop database if exists "+pgx.Identifier{name}.Sanitize())
		}
	}
}

// hasCode reports whether err is a PostgreSQL error with SQLSTATE code.
func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
