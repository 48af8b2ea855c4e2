package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// idemCmd runs the command in-process against url and returns its exit
// code and output.
func idemCmd(ctx context.Context, url string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	env := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	code := run(ctx, args, env, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "Commands:"},
		{[]string{"-h"}, exitOK, "inspect"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"inspect"}, exitUsage, "exactly one KEY"},
		{[]string{"inspect"}, exitUsage, "usage: idem inspect [flags] KEY"},
		{[]string{"migrate", "-interval", "1h"}, exitUsage, "-interval needs -partitioned"},
		{[]string{"sweep", "extra"}, exitUsage, "unexpected arguments"},
		{[]string{"sweep", "-every", "-1s"}, exitUsage, "must not be negative"},
		{[]string{"stats", "-table", "Bad Name"}, exitUsage, "invalid table"},
		{[]string{"sweep", "-h"}, exitOK, "-every"},
		{[]string{"sweep", "-h"}, exitOK, "usage: idem sweep [flags]\n"},
		{[]string{"inspect", "-h"}, exitOK, "usage: idem inspect [flags] KEY\n"},
		{[]string{"inspect", "-h"}, exitOK, "-operation"},
		{[]string{"inspect", "-h"}, exitOK, "-key-file"},
		{[]string{"check", "-h"}, exitOK, "usage: idem check [flags]\n"},
		{[]string{"count", "-h"}, exitOK, "usage: idem count [flags]\n"},
		{[]string{"stats", "-h"}, exitOK, "-connect-timeout"},
		{[]string{"check", "-connect-timeout", "0s"}, exitUsage, "-connect-timeout must be positive"},
		{[]string{"inspect", "-operation", "bad\x1fop", "k"}, exitUsage, "invalid operation"},
		{[]string{"inspect", "-key-file", "/nonexistent/key", "k"}, exitUsage, "key file"},
	}
	for _, c := range cases {
		code, out, errOut := idemCmd(ctx, "postgres://nowhere.invalid/x", c.args...)
		if code != c.code || !strings.Contains(out+errOut, c.want) {
			t.Errorf("idem %v: exit %d, output %q; want exit %d and %q", c.args, code, out+errOut, c.code, c.want)
		}
	}
	_, out, _ := idemCmd(ctx, "", "-h")
	for _, sub := range []string{"migrate", "check", "sweep", "stats", "count", "inspect", "Never scans", "Reads the whole table", "DATABASE_URL", "sslmode=verify-full", "-connect-timeout", "Exit codes"} {
		if !strings.Contains(out, sub) {
			t.Errorf("-h does not explain %s", sub)
		}
	}
}

func TestPlainTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if code, out, errOut := idemCmd(ctx, url, "migrate"); code != exitOK || !strings.Contains(out, "ready") {
		t.Fatalf("migrate: %d %s %s", code, out, errOut)
	}
	keys, err := idem.NewClient(pool, &idem.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := idem.Do(ctx, keys, fmt.Sprintf("k-%d", i), "hash-1", func(pgx.Tx) (string, error) { return "paid", nil }); err != nil {
			t.Fatal(err)
		}
	}
	sctx := idem.ContextWithScope(ctx, "tenant-7")
	if _, err := idem.Do(sctx, keys, "refused", "hash-2", func(pgx.Tx) (int, error) { return 0, idem.Refuse("card_declined", "no").WithStatus(402) }); err == nil {
		t.Fatal("want the refusal")
	}
	if _, err := pool.Exec(ctx, "UPDATE idempotency_keys SET expires_at = created_at - interval '2 hours' WHERE idempotency_key = 'k-0'"); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := idemCmd(ctx, url, "count")
	for _, want := range []string{"plain", "live keys:          3", "expired, unswept:   1", "in progress:        0", "KiB"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("count: exit %d, want %q in:\n%s%s", code, want, out, errOut)
		}
	}
	// stats is Client.Stats: its row figures are the planner's estimates.
	if _, err := pool.Exec(ctx, "ANALYZE idempotency_keys"); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = idemCmd(ctx, url, "stats")
	for _, want := range []string{"table:              idempotency_keys", "rows:               ~4 (estimated)", "live keys:          ~3 (estimated)", "expired, unswept:   1", "in progress:        0", "KiB"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("stats: exit %d, want %q in:\n%s%s", code, want, out, errOut)
		}
	}
	if code, out, errOut := idemCmd(ctx, url, "check"); code != exitOK || !strings.Contains(out, "idempotency_keys: ready (plain layout") {
		t.Fatalf("check: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = idemCmd(ctx, url, "inspect", "k-1")
	for _, want := range []string{"completed", "hash-1", "result:       6 bytes", `body:         "paid"`} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("inspect k-1: exit %d, want %q in:\n%s", code, want, out)
		}
	}
	code, out, _ = idemCmd(ctx, url, "inspect", "-scope", "tenant-7", "refused")
	if code != exitOK || !strings.Contains(out, "card_declined: no (status 402)") {
		t.Fatalf("inspect refused: exit %d\n%s", code, out)
	}
	code, out, _ = idemCmd(ctx, url, "inspect", "k-0")
	if code != exitOK || !strings.Contains(out, "expired, awaiting the sweeper") {
		t.Fatalf("inspect k-0: exit %d\n%s", code, out)
	}
	if code, _, errOut := idemCmd(ctx, url, "inspect", "missing"); code != exitNotFound || !strings.Contains(errOut, `no key "missing" in scope ""`) || !strings.Contains(errOut, "pass -scope") || !strings.Contains(errOut, "-operation") {
		t.Fatalf("inspect missing: exit %d, %s; want the scopes hint", code, errOut)
	}
	if code, out, _ := idemCmd(ctx, url, "sweep"); code != exitOK || !strings.Contains(out, "removed 1 expired keys") {
		t.Fatalf("sweep: exit %d, %s", code, out)
	}
	// A key in progress shows in stats and in inspect.
	release := holdKey(t, keys, "busy")
	_, out, _ = idemCmd(ctx, url, "stats")
	_, counted, _ := idemCmd(ctx, url, "count")
	_, insp, _ := idemCmd(ctx, url, "inspect", "busy")
	release()
	if !strings.Contains(out, "in progress:        1 (oldest running for") || !strings.Contains(counted, "in progress:        1 (oldest running for") || !strings.Contains(insp, "in_progress") {
		t.Fatalf("a key in progress: stats\n%s\ncount\n%s\ninspect\n%s", out, counted, insp)
	}
	if code, _, errOut := idemCmd(ctx, url, "migrate", "-partitioned"); code != exitFailure || !strings.Contains(errOut, "not partitioned") {
		t.Fatalf("migrate -partitioned over a plain table: exit %d, %s", code, errOut)
	}
}

func TestPartitionedTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA billing"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if code, out, errOut := idemCmd(ctx, url, "migrate", "-table", "billing.keys", "-partitioned", "-interval", "1s"); code != exitOK {
			t.Fatalf("migrate -partitioned: %d %s %s", code, out, errOut)
		}
	}
	if code, _, errOut := idemCmd(ctx, url, "migrate", "-partitioned", "-interval", "1500ms"); code != exitUsage {
		t.Fatalf("a fractional interval: exit %d, %s", code, errOut)
	}
	// Three seconds: count must find the keys live on a loaded machine too.
	keys, err := idem.NewClient(pool, &idem.Config{Table: "billing.keys", TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := idem.Do(ctx, keys, fmt.Sprintf("k-%d", i), "h", func(pgx.Tx) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := idemCmd(ctx, url, "count", "-table", "billing.keys")
	if code != exitOK || !strings.Contains(out, "partitioned (") || !strings.Contains(out, "billing.keys_p") || !strings.Contains(out, "live keys:          3") {
		t.Fatalf("count: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := idemCmd(ctx, url, "check", "-table", "billing.keys"); code != exitOK || !strings.Contains(out, "partitioned layout") {
		t.Fatalf("check: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := idemCmd(ctx, url, "inspect", "-table", "billing.keys", "k-2"); code != exitOK || !strings.Contains(out, "completed") {
		t.Fatalf("inspect: exit %d\n%s", code, out)
	}
	// sweep -every runs until interrupted, then exits 0; by then the keys
	// (TTL 3 s) and their partitions (of 1 s) are gone.
	sctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	code, out, errOut = idemCmd(sctx, url, "sweep", "-table", "billing.keys", "-every", "300ms")
	if code != exitOK || strings.Count(out, "removed") < 2 {
		t.Fatalf("sweep -every: exit %d\n%s%s", code, out, errOut)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM billing.keys").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d keys left after sweeping, %v", n, err)
	}
}

func TestBody(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`{"id":"ch_1"}`, `{"id":"ch_1"}`},
		{"", "(empty)"},
		{"\x00\x01binary\xff", `binary "\x00\x01binary\xff"`},
	}
	for _, c := range cases {
		if got := body([]byte(c.in)); got != c.want {
			t.Errorf("body(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
