package testdb_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/testkit/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// Main gives the package a migrated database of its own in DATABASE_URL.
func TestMainSetsDatabaseURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var db string
	var table *string
	if err := conn.QueryRow(ctx, "select current_database(), to_regclass('idempotency_keys')::text").Scan(&db, &table); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(db, "idem_test_") || table == nil {
		t.Fatalf("DATABASE_URL names database %q, idempotency_keys %v: want a database of the harness with idem's schema", db, table)
	}
}

// An example connects as a user's program does; the package's TestMain,
// testdb.Main, has set DATABASE_URL.
func ExampleMain() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	var keys int
	err = pool.QueryRow(ctx, "select count(*) from idempotency_keys").Scan(&keys)
	fmt.Println(keys, err)
	// Output: 0 <nil>
}
