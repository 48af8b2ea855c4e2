package kit_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/kit"
	"github.com/idemhq/idem/testkit/testdb"
)

func exec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), sql); err != nil {
		t.Fatal(err)
	}
}

func TestOpenDBErrors(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := t.Context()
	for _, tc := range []struct {
		db     idem.Beginner
		table  string
		ignore []string
		want   string
	}{
		{nil, "", nil, "DB is nil"},
		{pool, "no_such_keys", nil, `no key table "no_such_keys"`},
		{pool, "Bad Name", nil, "invalid table name"},
		{pool, "", []string{"no_such_table"}, `IgnoreTables: the database has no table "no_such_table"`},
	} {
		if _, err := kit.OpenDB(ctx, tc.db, tc.table, tc.ignore); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenDB(table %q, ignore %q) = %v, want an error containing %q", tc.table, tc.ignore, err, tc.want)
		}
	}
	client, err := idem.NewClient(pool, &idem.Config{Table: "idempotency_keys"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kit.OpenDB(ctx, client, "other_keys", nil); err == nil || !strings.Contains(err.Error(), "differs from the table of the *idem.Client") {
		t.Errorf("OpenDB(Client, other table) = %v", err)
	}
	if db, err := kit.OpenDB(ctx, client, "", nil); err != nil || db.Table() != "idempotency_keys" {
		t.Errorf("OpenDB(Client) = %v, %v", db, err)
	}
}

// The digest sees committed rows of every table but the key table and the
// ignored ones; rolled-back writes and sequences leave it as it was.
func TestDigest(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	exec(t, pool, `create table a (id bigserial primary key, v text);
		create schema other; create table other."Mixed Case" (v int);
		create table ignored (v int);
		insert into a (v) values ('x')`)
	db, err := kit.OpenDB(t.Context(), pool, "", []string{"ignored"})
	if err != nil {
		t.Fatal(err)
	}
	digest := func() kit.Digest {
		d, err := db.Digest(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d0 := digest()
	if _, ok := d0[`other."Mixed Case"`]; !ok || len(d0) != 2 {
		t.Fatalf("digest %v, want a and other.\"Mixed Case\"", d0)
	}

	// A rolled-back insert advances a's sequence; the digest stays.
	err = pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), "insert into a (v) values ('y')"); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	if err == nil {
		t.Fatal("the transaction committed")
	}
	exec(t, pool, `insert into ignored values (1);
		insert into idempotency_keys (idempotency_key, request_hash, status, expires_at) values ('k', 'h', 'completed', now())`)
	if changed := d0.Changed(digest()); len(changed) != 0 {
		t.Errorf("changed %v after a rollback and writes to ignored tables, want none", changed)
	}

	exec(t, pool, `update a set v = 'z'; insert into other."Mixed Case" values (1); create table new_one (v int)`)
	if changed, want := d0.Changed(digest()), []string{"a", "new_one", `other."Mixed Case"`}; !slices.Equal(changed, want) {
		t.Errorf("changed %v, want %v", changed, want)
	}

	// The digest's helper function lives only in its transaction.
	var n int
	if err := pool.QueryRow(t.Context(), "select count(*) from pg_proc where proname = 'idemtest_digest'").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d digest functions left (%v), want none", n, err)
	}
}

// The fault fails the completion of an armed key only, in a key table of
// any schema, and leaves nothing behind.
func TestFault(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	exec(t, pool, `create schema billing; create table billing.keys (like idempotency_keys including all)`)
	client, err := idem.NewClient(pool, &idem.Config{Table: "billing.keys"})
	if err != nil {
		t.Fatal(err)
	}
	db, err := kit.OpenDB(t.Context(), client, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	fault, err := db.InstallFault(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ran int
	do := func(key string) error {
		_, err := idem.Do(ctx, client, key, "hash", func(tx pgx.Tx) (int, error) { ran++; return 1, nil })
		return err
	}
	if err := fault.Arm(ctx, "armed"); err != nil {
		t.Fatal(err)
	}
	err = do("armed")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !strings.Contains(pgErr.Message, "idem test kit: injected failure") {
		t.Errorf("Do with an armed key = %v, want the kit's failure", err)
	}
	if stored, err := db.Stored(ctx, "armed"); err != nil || stored {
		t.Errorf("Stored(armed) = %t, %v; want false", stored, err)
	}
	if err := do("other"); err != nil {
		t.Errorf("Do with another key = %v", err)
	}
	if err := fault.Disarm(ctx, "armed"); err != nil {
		t.Fatal(err)
	}
	if err := do("armed"); err != nil {
		t.Errorf("Do after Disarm = %v", err)
	}
	if ran != 3 {
		t.Errorf("fn ran %d times, want 3", ran)
	}
	if stored, err := db.Stored(ctx, "armed"); err != nil || !stored {
		t.Errorf("Stored(armed) = %t, %v; want true", stored, err)
	}
	if err := db.Forget(ctx, []string{"armed", "other"}); err != nil {
		t.Fatal(err)
	}
	if err := fault.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fault.Remove(context.Background()); err != nil {
		t.Errorf("a second Remove = %v", err)
	}
	var objects, keys int
	err = pool.QueryRow(ctx, `select
		(select count(*) from pg_class where relname like 'idemtest\_%')
		+ (select count(*) from pg_proc where proname like 'idemtest\_%')
		+ (select count(*) from pg_trigger where tgname like 'idemtest\_%'),
		(select count(*) from billing.keys)`).Scan(&objects, &keys)
	if err != nil || objects != 0 || keys != 0 {
		t.Errorf("left %d kit objects and %d keys (%v), want none", objects, keys, err)
	}
}
