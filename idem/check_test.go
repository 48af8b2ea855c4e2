package idem_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/schema"
	"github.com/idemhq/idem/testkit/testdb"
)

// TestCheck runs Client.Check against each way a deployment can be wrong,
// and checks that each is named with what to do, while a table idem made
// passes on both layouts.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t)
	client := func(t *testing.T, table string) *idem.Client {
		t.Helper()
		c, err := idem.NewClient(pool, &idem.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	exec := func(t *testing.T, sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	wantProblem := func(t *testing.T, err error, wants ...string) {
		t.Helper()
		if err == nil {
			t.Fatalf("Check passed; want an error naming %q", wants)
		}
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("Check: %v\nwant it to say %q", err, w)
			}
		}
	}

	t.Run("plain table", func(t *testing.T) {
		if err := client(t, idem.DefaultTable).Check(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("partitioned table", func(t *testing.T) {
		if err := schema.ApplyPartitioned(ctx, pool, "check_parted", time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := client(t, "check_parted").Check(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("without the tables of operations", func(t *testing.T) {
		if err := schema.ApplyTable(ctx, pool, "check_noops"); err != nil {
			t.Fatal(err)
		}
		exec(t, "DROP TABLE check_noops_steps")
		wantProblem(t, client(t, "check_noops").Check(ctx), "check_noops_operations, check_noops_steps", "idem migrate")
	})
	t.Run("a status check from before operations", func(t *testing.T) {
		if err := schema.ApplyTable(ctx, pool, "check_oldstatus"); err != nil {
			t.Fatal(err)
		}
		exec(t, "ALTER TABLE check_oldstatus DROP CONSTRAINT check_oldstatus_status_check, ADD CONSTRAINT check_oldstatus_status_check CHECK (status IN ('in_progress', 'completed', 'refused'))")
		wantProblem(t, client(t, "check_oldstatus").Check(ctx), "does not admit 'unfinished'")
	})
	t.Run("colocation without Citus", func(t *testing.T) {
		c, err := idem.NewClient(pool, &idem.Config{ColocateWith: "accounts"})
		if err != nil {
			t.Fatal(err)
		}
		wantProblem(t, c.Check(ctx), "Config.ColocateWith names accounts", "no Citus extension")
	})
	t.Run("missing table", func(t *testing.T) {
		wantProblem(t, client(t, "check_missing").Check(ctx), "check_missing does not exist", "schema.ApplyTable", "idem migrate")
	})
	t.Run("another table under the name", func(t *testing.T) {
		exec(t, "CREATE TABLE check_other (scope text, idempotency_key text, request_hash text, status text, response text, created_at timestamptz, completed_at timestamptz, expires_at timestamptz, PRIMARY KEY (scope, idempotency_key))")
		wantProblem(t, client(t, "check_other").Check(ctx), "response bytea", "refusal jsonb", "idem migrate")
	})
	t.Run("no unique key", func(t *testing.T) {
		exec(t, "CREATE TABLE check_nokey (LIKE idempotency_keys INCLUDING DEFAULTS)")
		wantProblem(t, client(t, "check_nokey").Check(ctx), "no unique index on (scope, idempotency_key)", "idem migrate")
	})
	t.Run("partitioned by another column", func(t *testing.T) {
		exec(t, "CREATE TABLE check_byexpiry (LIKE idempotency_keys INCLUDING DEFAULTS, PRIMARY KEY (scope, idempotency_key, expires_at)) PARTITION BY RANGE (expires_at)")
		exec(t, "CREATE TABLE check_byexpiry_default PARTITION OF check_byexpiry DEFAULT")
		wantProblem(t, client(t, "check_byexpiry").Check(ctx), "RANGE (expires_at)", "RANGE (created_at)", "idem migrate -partitioned")
	})
	t.Run("no partition for now", func(t *testing.T) {
		if err := schema.ApplyPartitioned(ctx, pool, "check_stale", time.Hour); err != nil {
			t.Fatal(err)
		}
		rows, err := pool.Query(ctx, "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'check_stale'::regclass")
		if err != nil {
			t.Fatal(err)
		}
		parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(parts) == 0 {
			t.Fatalf("partitions %v, %v", parts, err)
		}
		for _, p := range parts {
			exec(t, "DROP TABLE "+p)
		}
		exec(t, "CREATE TABLE check_stale_old PARTITION OF check_stale FOR VALUES FROM ('2001-01-01') TO ('2001-01-02')")
		wantProblem(t, client(t, "check_stale").Check(ctx), "no partition for keys claimed now", "idem migrate -partitioned")
	})
	t.Run("role without write privileges", func(t *testing.T) {
		b := make([]byte, 6)
		rand.Read(b)
		role := "idem_check_" + hex.EncodeToString(b)
		exec(t, "CREATE ROLE "+role+" NOLOGIN")
		t.Cleanup(func() {
			pool.Exec(ctx, "REVOKE ALL ON idempotency_keys FROM "+role)
			if _, err := pool.Exec(ctx, "DROP ROLE "+role); err != nil {
				t.Errorf("drop role %s: %v", role, err)
			}
		})
		exec(t, "GRANT SELECT, DELETE ON idempotency_keys TO "+role)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
			t.Fatal(err)
		}
		wantProblem(t, client(t, idem.DefaultTable).On(tx).Check(ctx), "role "+role+" may not INSERT, UPDATE rows", "GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys TO "+role)
	})
	t.Run("read-only session", func(t *testing.T) {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		wantProblem(t, client(t, idem.DefaultTable).On(tx).Check(ctx), "read-only")
	})
}

// TestSweepLookupForgetStatsOnAMissingTable checks that every operation that can
// meet a missing key table says how to make it.
func TestSweepLookupForgetStatsOnAMissingTable(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t)
	keys, err := idem.NewClient(pool, &idem.Config{Table: "nowhere"})
	if err != nil {
		t.Fatal(err)
	}
	_, sweepErr := keys.Sweep(ctx)
	_, lookupErr := keys.Lookup(ctx, "", "k")
	_, forgetErr := keys.Forget(ctx, "", "k")
	_, statsErr := keys.Stats(ctx)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, txSweepErr := keys.On(tx).Sweep(ctx)
	for name, err := range map[string]error{"Sweep": sweepErr, "Sweep in a transaction": txSweepErr, "Lookup": lookupErr, "Forget": forgetErr, "Stats": statsErr} {
		// PostgreSQL's own message names the table that is missing.
		if err == nil || !strings.Contains(err.Error(), `"nowhere" does not exist`) || !strings.Contains(err.Error(), "idem migrate") {
			t.Errorf("%s on a missing table: %v; want it to say the table does not exist and how to apply the schema", name, err)
		}
	}
}

// TestLookupSealed checks that Lookup without the Sealer reports a sealed
// row as Sealed, with neither the ciphertext as its Result nor an error
// calling it corrupt, and that Lookup with the Sealer opens it.
func TestLookupSealed(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t)
	key := make([]byte, 32)
	rand.Read(key)
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := idem.NewClient(pool, &idem.Config{Sealer: idem.NewAEADSealer(gcm)})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, sealed, "paid", "h1", func(pgx.Tx) (string, error) { return "charge-1", nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, sealed, "declined", "h2", func(pgx.Tx) (string, error) {
		return "", idem.Refuse("card_declined", "insufficient funds").WithStatus(402)
	}); err == nil {
		t.Fatal("want the refusal")
	}

	t.Run("with the Sealer", func(t *testing.T) {
		rec, err := sealed.Lookup(ctx, "", "paid")
		if err != nil || rec.Sealed || rec.Status != idem.StatusCompleted {
			t.Fatalf("Lookup: %+v, %v", rec, err)
		}
		if v, err := idem.DecodeResult[string](rec); err != nil || v != "charge-1" {
			t.Fatalf("result %q, %v", v, err)
		}
		rec, err = sealed.Lookup(ctx, "", "declined")
		if err != nil || rec.Sealed || rec.Refusal == nil || rec.Refusal.Code != "card_declined" {
			t.Fatalf("Lookup of the refusal: %+v, %v", rec, err)
		}
	})
	t.Run("refused, without the Sealer", func(t *testing.T) {
		rec, err := plain.Lookup(ctx, "", "declined")
		if err != nil {
			t.Fatalf("Lookup: %v; a sealed row is not corrupt", err)
		}
		if !rec.Sealed || rec.Status != idem.StatusRefused || rec.Refusal != nil || rec.Result != nil || rec.RequestHash != "h2" {
			t.Fatalf("Lookup: %+v; want it Sealed, refused, with no refusal or result", rec)
		}
	})
	t.Run("completed, without the Sealer", func(t *testing.T) {
		// The refusal column of a sealed row holds the JSON string
		// "sealed", written with the sealed result.
		rec, err := plain.Lookup(ctx, "", "paid")
		if err != nil || !rec.Sealed || rec.Status != idem.StatusCompleted || rec.Result != nil {
			t.Fatalf("Lookup: %+v, %v; want it Sealed, with no result", rec, err)
		}
		if rec, err := sealed.Lookup(ctx, "", "paid"); err != nil || rec.Sealed {
			t.Fatalf("Lookup with the Sealer of a marked row: %+v, %v", rec, err)
		}
	})
}
