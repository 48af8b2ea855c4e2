package integration_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/schema"
)

// TestPartmanManagesPartitions lets pg_partman make and drop the partitions
// of the partitioned key table, as docs/SCALING.md describes: the parent
// from schema/partitioned/001_idempotency_keys.sql, create_parent on
// created_at, a retention of TTL plus the longest work. Client.Sweep sees that
// pg_partman manages the table and runs its maintenance instead of its own.
//
// `make test` installs the extension's package (scripts/ensure-partman.sh);
// the test skips only where the server does not offer it.
func TestPartmanManagesPartitions(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	var available bool
	if err := s.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman')").Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		t.Skip("pg_partman is not installed on the test server: `make test` installs it with apt-get (scripts/ensure-partman.sh) where it runs as root on Debian; elsewhere install postgresql-NN-partman")
	}
	files, err := schema.PartitionedFiles()
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Second
	for _, q := range []string{
		"DROP TABLE idempotency_keys",
		"CREATE SCHEMA partman",
		"CREATE EXTENSION pg_partman SCHEMA partman",
		files[0].SQL, // the parent only: create_parent makes the DEFAULT partition
		"SELECT partman.create_parent('public.idempotency_keys', 'created_at', 'native', '2 seconds', p_premake := 3, p_jobmon := false)",
		// Retention counts from a partition's upper bound: a key claimed
		// just before it lives until bound + work + TTL. Here TTL is 1 s
		// and no work takes more than 1 s.
		"UPDATE partman.part_config SET retention = '2 seconds', retention_keep_table = false, infinite_time_partitions = true WHERE parent_table = 'public.idempotency_keys'",
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%.60s: %v", q, err)
		}
	}
	keys, err := idem.NewClient(s.pool, &idem.Config{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	one := func(pgx.Tx) (int, error) { return 1, nil }
	// Maintenance must keep partitions made ahead of the keys: a key that
	// lands in the DEFAULT partition blocks pg_partman from making its
	// range's partition until the key has expired and been swept.
	var oldest string
	for i := range 6 {
		if _, err := keys.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := idem.Do(ctx, keys, fmt.Sprintf("k-%d", i), "h", one); err != nil {
			t.Fatal(err)
		}
		if i == 5 {
			// At once: the TTL is a second, which a stalled machine outlasts.
			if _, replayed, err := runReplayed(ctx, keys, "k-5", "h", one); err != nil || !replayed {
				t.Fatalf("a live key: %v, replayed %v", err, replayed)
			}
		}
		if i == 0 {
			// Read now: on a loaded machine the loop may outlast k-0's TTL,
			// and a sweep in it may drop its partition already.
			if err := s.pool.QueryRow(ctx, "SELECT tableoid::regclass::text FROM idempotency_keys WHERE idempotency_key = 'k-0'").Scan(&oldest); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(400 * time.Millisecond)
	}
	first := partitionsOf(t, s.pool)
	time.Sleep(2 * (ttl + 2*time.Second))
	if _, err := keys.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	after := partitionsOf(t, s.pool)
	for _, p := range after {
		if p == oldest {
			t.Fatalf("pg_partman kept %s past its retention; partitions %v", oldest, after)
		}
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d expired keys left", n)
	}
	// Keys keep working on the partitions pg_partman makes.
	if _, err := idem.Do(ctx, keys, "k-0", "h2", one); err != nil {
		t.Fatal(err)
	}
	if _, replayed, err := runReplayed(ctx, keys, "k-0", "h2", one); err != nil || !replayed {
		t.Fatalf("after maintenance: %v, replayed %v", err, replayed)
	}
	t.Logf("partitions before: %d, after: %d (pg_partman made and dropped them)", len(first), len(after))
}
