package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/testdb"
)

var execModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
}

// TestExecModesAndIsolation: every pgx exec mode (the default, those used
// behind PgBouncer, the simple protocol) × the session's default isolation
// × the level WithTxOptions asks for, on a pool and on a connection. Each
// picks the deferred protocol, claim.sql, or the fall-back from one to the
// other: fn runs once per key and sees the level asked for, calls replay,
// an expired key is claimed again, a refusal is stored, and no SET leaks
// into the session's later transactions.
func TestExecModesAndIsolation(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("120 databases: make test-long runs it (IDEM_TEST_LONG=1)")
	}
	for _, mode := range execModes {
		for _, def := range []string{"", "repeatable read", "serializable"} {
			for _, iso := range []pgx.TxIsoLevel{"", pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
				for _, path := range []string{"pool", "conn"} {
					name := fmt.Sprintf("%s/def=%q/iso=%q/%s", mode, def, iso, path)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						modeAndIsolation(t, mode, def, iso, path)
					})
				}
			}
		}
	}
}

func modeAndIsolation(t *testing.T, mode pgx.QueryExecMode, def string, iso pgx.TxIsoLevel, path string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.New(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.MaxConns = 1
		if def != "" {
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = def
		}
	})
	var db idem.Beginner = pool
	var conn *pgxpool.Conn
	if path == "conn" {
		var err error
		conn, err = pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		db = conn.Conn()
	}
	var opts []idem.Option
	if iso != "" {
		opts = append(opts, idem.WithTxOptions(pgx.TxOptions{IsoLevel: iso}))
	}
	want := string(iso)
	if want == "" {
		want = def
	}
	if want == "" {
		want = "read committed"
	}
	runs := 0
	fn := func(tx pgx.Tx) (string, error) {
		runs++
		var lvl string
		err := tx.QueryRow(ctx, "select current_setting('transaction_isolation')").Scan(&lvl)
		return lvl, err
	}
	for i := range 3 {
		got, err := idem.Do(ctx, db, "k", "h", fn, opts...)
		if err != nil || got != want || runs != 1 {
			t.Fatalf("call %d: %q, %v, runs %d; want %q, runs 1", i, got, err, runs, want)
		}
	}
	// Expire it: the next call must run fn again and replace the row.
	var err error
	if conn != nil {
		_, err = conn.Exec(ctx, `update idempotency_keys set created_at = now() - interval '3 days', expires_at = now() - interval '2 days', completed_at = now() - interval '3 days'`)
	} else {
		_, err = pool.Exec(ctx, `update idempotency_keys set created_at = now() - interval '3 days', expires_at = now() - interval '2 days', completed_at = now() - interval '3 days'`)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		got, err := idem.Do(ctx, db, "k", "h", fn, opts...)
		if err != nil || got != want || runs != 2 {
			t.Fatalf("after expiry call %d: %q, %v, runs %d; want %q, runs 2", i, got, err, runs, want)
		}
	}
	// A refusal is stored and replayed.
	ref := idem.Refuse("nope", "no")
	for i := range 2 {
		_, err := idem.Do(ctx, db, "r", "h", func(tx pgx.Tx) (int, error) { runs++; return 1, ref }, opts...)
		if !errors.Is(err, ref) || runs != 3 {
			t.Fatalf("refusal call %d: %v runs %d", i, err, runs)
		}
	}
	var show, n string
	q := func(sql string, dst *string) {
		var err error
		if conn != nil {
			err = conn.QueryRow(ctx, sql).Scan(dst)
		} else {
			err = pool.QueryRow(ctx, sql).Scan(dst)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	q("show transaction_isolation", &show)
	wantShow := def
	if wantShow == "" {
		wantShow = "read committed"
	}
	if show != wantShow {
		t.Errorf("the session's transactions are now %q, want %q (leaked SET)", show, wantShow)
	}
	q("select string_agg(status, ',' order by idempotency_key) from idempotency_keys", &n)
	if n != "completed,refused" {
		t.Errorf("rows %q", n)
	}
}

// TestUnwritableKeyTableRunsNothing: a session whose transactions are
// read-only (ALTER ROLE/DATABASE ... SET default_transaction_read_only, a hot
// standby behind a misrouted pool) or a role without INSERT on the key
// table. The key's row could never be stored, so fn must not run: with the
// deferred protocol the row is written only after fn, and the claim's
// assertion has to refuse such a session up front, as claim.sql's insertion
// does. Replays still work there.
func TestUnwritableKeyTableRunsNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  func(*pgxpool.Config)
		opts []idem.Option
	}{
		{"readonly/default", func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on" }, nil},
		{"readonly/repeatable_read", func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on" },
			[]idem.Option{idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.RepeatableRead})}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			pool := testdb.New(t, c.cfg)
			runs := 0
			for range 3 {
				_, err := idem.Do(ctx, pool, "k", "h", func(tx pgx.Tx) (int, error) {
					runs++ // e.g. a call to a payment gateway
					return 1, nil
				}, c.opts...)
				if err == nil {
					t.Fatal("a call in a read-only session succeeded")
				}
			}
			if runs != 0 {
				t.Errorf("fn ran %d times although the key can never be stored", runs)
			}
		})
	}
	t.Run("no_insert_privilege", func(t *testing.T) {
		ctx := context.Background()
		s := newSetup(t)
		role := fmt.Sprintf("idem_test_ro_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
		for _, sql := range []string{
			"CREATE ROLE " + role + " LOGIN",
			"GRANT SELECT, UPDATE ON idempotency_keys TO " + role,
		} {
			if _, err := s.pool.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			_, _ = s.pool.Exec(ctx, "REVOKE ALL ON idempotency_keys FROM "+role)
			if _, err := s.pool.Exec(ctx, "DROP ROLE "+role); err != nil {
				t.Errorf("drop the test's role %s: %v", role, err)
			}
		})
		if _, err := idem.Do(ctx, s.pool, "done", "h", func(tx pgx.Tx) (int, error) { return 7, nil }); err != nil {
			t.Fatal(err)
		}
		cfg := s.pool.Config()
		cfg.ConnConfig.User = role
		ro, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer ro.Close()
		runs := 0
		for range 3 {
			_, err := idem.Do(ctx, ro, "k", "h", func(tx pgx.Tx) (int, error) { runs++; return 1, nil })
			if err == nil {
				t.Fatal("a call without INSERT on the key table succeeded")
			}
		}
		if runs != 0 {
			t.Errorf("fn ran %d times although the key can never be stored", runs)
		}
		// A completed key still replays for that role: a replay writes nothing.
		if got, err := idem.Do(ctx, ro, "done", "h", func(tx pgx.Tx) (int, error) { runs++; return 1, nil }); err != nil || got != 7 || runs != 0 {
			t.Fatalf("replay for a role that cannot insert: %d, %v, fn ran %d times; want 7 replayed", got, err, runs)
		}
	})
}
