package integration_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/schema"
	"github.com/idemhq/idem/testkit/testdb"
)

// hostileHash is a valid request hash for tests that are about something else.
var hostileHash = idem.HashBytes([]byte("hostile"))

// hostileAcceptedKeys are odd but valid keys: each must be stored byte for
// byte and replay.
var hostileAcceptedKeys = []struct{ name, key string }{
	{"single quotes", `it's 'quoted'`},
	{"double quotes", `"key"`},
	{"backslashes", `C:\keys\\n\x00\'`},
	{"sql injection", `'; DROP TABLE idempotency_keys; --`},
	{"sql comment and semicolon", `1; SELECT pg_sleep(10) /*`},
	{"like wildcards", `%_%`},
	{"placeholder", `$1 $2`},
	{"emoji", "💳🔁👍🏽"},
	{"right to left", "שלום-עולם-مرحبا"},
	{"bidi override", "\u202egnp.exe"},
	{"zero width joiner", "a\u200db\ufeff"},
	{"noncharacters", "\ufffe\uffff\U0010ffff"},
	{"replacement character", "\ufffd"},
	{"255 ascii bytes", strings.Repeat("k", 255)},
	{"255 bytes of 3-byte runes", strings.Repeat("€", 85)},
	{"space only", " "},
}

// hostileRejectedKeys are invalid keys: Do must refuse them before any
// database work.
var hostileRejectedKeys = []struct{ name, key string }{
	{"empty", ""},
	{"256 bytes", strings.Repeat("k", 256)},
	{"256 bytes ending in a 2-byte rune", strings.Repeat("k", 254) + "é"},
	{"invalid utf-8", "\xff\xfe"},
	{"truncated rune", "abc\xe2\x82"},
	{"overlong encoding", "\xc0\xaf"},
	{"utf-16 surrogate", "\xed\xa0\x80"},
	{"nul", "a\x00b"},
	{"tab", "a\tb"},
	{"newline", "line\n"},
	{"escape", "\x1b[31mred"},
	{"delete", "a\x7f"},
	{"c1 next line", "a\u0085b"},
}

func TestHostileKeysRoundTrip(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		for i, tc := range hostileAcceptedKeys {
			amount := int64(i + 1)
			runs := 0
			first, err := do(t, s, v, tc.key, hostileHash, chargeFn(ctx, amount, &runs))
			if err != nil {
				t.Fatalf("%s: first call: %v", tc.name, err)
			}
			again, replayed, err := runReplayed(ctx, s.pool, tc.key, hostileHash, chargeFn(ctx, amount, &runs))
			if err != nil {
				t.Fatalf("%s: retry: %v", tc.name, err)
			}
			if runs != 1 || !replayed || again != first {
				t.Fatalf("%s: fn ran %d times, replayed=%v, retry returned %+v, first %+v", tc.name, runs, replayed, again, first)
			}
			var stored string
			err = s.pool.QueryRow(ctx, "SELECT idempotency_key FROM idempotency_keys WHERE idempotency_key = $1", tc.key).Scan(&stored)
			if err != nil || stored != tc.key {
				t.Fatalf("%s: stored key %q (%v), want %q", tc.name, stored, err, tc.key)
			}
		}
		if got, want := s.charges(), len(hostileAcceptedKeys); got != want {
			t.Errorf("charges = %d, want %d (one per key)", got, want)
		}
		if got, want := s.keys("completed"), len(hostileAcceptedKeys); got != want {
			t.Errorf("completed keys = %d, want %d", got, want)
		}
		if n := s.keys("in_progress"); n != 0 {
			t.Errorf("%d keys left in progress", n)
		}
		// The keys that look like SQL were data, not statements.
		if n := s.count("SELECT count(*) FROM pg_tables WHERE tablename = 'idempotency_keys'"); n != 1 {
			t.Errorf("idempotency_keys tables = %d, want 1", n)
		}
	})
}

func TestHostileKeysRejected(t *testing.T) {
	s := newSetup(t)
	ctx := context.Background()
	for _, tc := range hostileRejectedKeys {
		t.Run(tc.name, func(t *testing.T) {
			runs := 0
			_, err := idem.Do(ctx, s.pool, tc.key, hostileHash, chargeFn(ctx, 1, &runs))
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("Do(%q) = %v, want ErrInvalidKey", tc.key, err)
			}
			if runs != 0 {
				t.Fatalf("fn ran %d times", runs)
			}
			if err := idem.ValidateKey(tc.key); !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("ValidateKey(%q) = %v, want ErrInvalidKey", tc.key, err)
			}
		})
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Errorf("%d keys stored, want 0", n)
	}
	if n := s.charges(); n != 0 {
		t.Errorf("%d charges, want 0", n)
	}
}

// hostileCounter counts every query and batch a pool sends.
type hostileCounter struct{ n atomic.Int64 }

func (c *hostileCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *hostileCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *hostileCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *hostileCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *hostileCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// hostileTracedPool returns a pool on a fresh database that counts what it
// sends, and that database's table y, a bystander that SQL smuggled into a
// table name would drop.
func hostileTracedPool(t *testing.T) (*pgxpool.Pool, *hostileCounter) {
	t.Helper()
	c := &hostileCounter{}
	pool := testdb.New(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = c })
	if _, err := pool.Exec(context.Background(), "CREATE TABLE y (id int); CREATE TABLE \"Foo\" (id int)"); err != nil {
		t.Fatal(err)
	}
	c.n.Store(0)
	return pool, c
}

func TestHostileTableNames(t *testing.T) {
	pool, sent := hostileTracedPool(t)
	ctx := context.Background()
	for _, table := range []string{
		"x; drop table y",
		"y; --",
		`"Foo"`,
		"Foo",
		"a.b.c",
		strings.Repeat("t", 64),
		strings.Repeat("t", 38), // its derived constraint names would pass 63 bytes
		"",
		".keys",
		"1keys",
		"keys ",
		"kéys",
		"public.idempotency_keys\x00",
		"idempotency_keys' OR '1'='1",
	} {
		t.Run(fmt.Sprintf("%q", table), func(t *testing.T) {
			// In a Config, an empty table means the default; every other
			// name here is refused before a Client exists to use it.
			keys, err := idem.NewClient(pool, &idem.Config{Table: table})
			switch {
			case table == "" && (err != nil || keys.Table() != idem.DefaultTable):
				t.Fatalf("NewClient(Table: \"\") = %v; want the default table", err)
			case table != "" && !errors.Is(err, idem.ErrInvalidTable):
				t.Fatalf("NewClient(Table: %q) = %v, want ErrInvalidTable", table, err)
			}
			if err := schema.ApplyTable(ctx, pool, table); !errors.Is(err, idem.ErrInvalidTable) {
				t.Fatalf("ApplyTable(%q) = %v, want ErrInvalidTable", table, err)
			}
			if n := sent.n.Load(); n != 0 {
				t.Fatalf("%d statements reached the database", n)
			}
		})
	}
	// A valid schema-qualified name works, and the bystanders survived.
	qualified, err := idem.NewClient(pool, &idem.Config{Table: "public.idempotency_keys"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, qualified, "k", hostileHash, func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatalf("Do on public.idempotency_keys: %v", err)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename IN ('y', 'Foo', 'idempotency_keys')`).Scan(&tables); err != nil || tables != 3 {
		t.Fatalf("tables y, Foo and idempotency_keys: %d of 3 (%v)", tables, err)
	}
}

func TestHostileScopeAndHash(t *testing.T) {
	pool, sent := hostileTracedPool(t)
	ctx := context.Background()
	fn := func(pgx.Tx) (int, error) { return 1, nil }
	for _, tc := range []struct {
		name, scope, hash string
		want              error
	}{
		{"scope invalid utf-8", "tenant-\xff", hostileHash, idem.ErrInvalidScope},
		{"scope nul", "tenant\x00", hostileHash, idem.ErrInvalidScope},
		{"scope newline", "tenant\nadmin", hostileHash, idem.ErrInvalidScope},
		{"scope 256 bytes", strings.Repeat("s", 256), hostileHash, idem.ErrInvalidScope},
		{"hash empty", "", "", idem.ErrInvalidRequestHash},
		{"hash invalid utf-8", "", "\xff", idem.ErrInvalidRequestHash},
		{"hash 256 bytes", "", strings.Repeat("h", 256), idem.ErrInvalidRequestHash},
		{"hash control character", "", "abc\r", idem.ErrInvalidRequestHash},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idem.Do(idem.ContextWithScope(ctx, tc.scope), pool, "k", tc.hash, fn)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Do = %v, want %v", err, tc.want)
			}
			if n := sent.n.Load(); n != 0 {
				t.Fatalf("%d statements reached the database", n)
			}
		})
	}
	t.Run("wrap with an invalid operation", func(t *testing.T) {
		wrapped := idem.Wrap(pool, "charge\xff", func(context.Context, pgx.Tx, int) (int, error) { return 0, nil })
		if _, _, err := wrapped(ctx, "k", 1); !errors.Is(err, idem.ErrInvalidOption) {
			t.Fatalf("call of Wrap(\"charge\\xff\") = %v, want ErrInvalidOption", err)
		}
		if n := sent.n.Load(); n != 0 {
			t.Fatalf("%d statements reached the database", n)
		}
	})
	// A valid scope full of SQL is data: it isolates its keys like any other.
	for i, scope := range []string{"tenant'; DROP TABLE y; --", "tenant\\", "租户/💳"} {
		got, err := idem.Do(idem.ContextWithScope(ctx, scope), pool, "k", hostileHash, func(pgx.Tx) (int, error) { return i, nil })
		if err != nil || got != i {
			t.Fatalf("scope %q: %d, %v", scope, got, err)
		}
	}
	var rows, stray int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'in_progress') FROM idempotency_keys`).Scan(&rows, &stray); err != nil {
		t.Fatal(err)
	}
	if rows != 3 || stray != 0 {
		t.Fatalf("rows = %d (want 3, one per valid scope), in progress = %d", rows, stray)
	}
}

func TestHostileBodyChangesBetweenRetries(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		hashA, err := idem.HashJSONBytes([]byte(`{"account":1,"amount":500}`))
		if err != nil {
			t.Fatal(err)
		}
		// The same request respelled is the same request.
		respelled, err := idem.HashJSONBytes([]byte(` { "amount" : 5e2, "account" : 1.0 } `))
		if err != nil || respelled != hashA {
			t.Fatalf("respelled body hashed %s (%v), want %s", respelled, err, hashA)
		}
		hashB, err := idem.HashJSONBytes([]byte(`{"account":1,"amount":50000}`))
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		first, err := do(t, s, v, "order-1", hashA, chargeFn(ctx, 500, &runs))
		if err != nil {
			t.Fatal(err)
		}
		_, err = do(t, s, v, "order-1", hashB, chargeFn(ctx, 50000, &runs))
		if !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("retry with a changed body: %v, want ErrMismatch", err)
		}
		again, err := do(t, s, v, "order-1", respelled, chargeFn(ctx, 500, &runs))
		if err != nil || again != first {
			t.Fatalf("retry with the original body: %+v, %v; want %+v", again, err, first)
		}
		if runs != 1 || s.charges() != 1 || s.keys("completed") != 1 || s.keys("in_progress") != 0 {
			t.Fatalf("runs = %d, charges = %d, completed = %d, in progress = %d; want 1, 1, 1, 0",
				runs, s.charges(), s.keys("completed"), s.keys("in_progress"))
		}
	})
}

// hostileBigDoc returns a JSON array of n objects, members written in the
// given order, about 60 bytes per object.
func hostileBigDoc(n int, reversed bool) []byte {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		if reversed {
			fmt.Fprintf(&b, `{"note":"line \"%d\" ☃","amount":%d.0,"id":%d}`, i, i%1000, i)
		} else {
			fmt.Fprintf(&b, `{"id":%d,"amount":%d,"note":"line \u0022%d\u0022 ☃"}`, i, i%1000, i)
		}
	}
	b.WriteByte(']')
	return []byte(b.String())
}

func TestHostileHugeAndDeepJSON(t *testing.T) {
	s := newSetup(t)
	ctx := context.Background()

	t.Run("several MiB", func(t *testing.T) {
		doc := hostileBigDoc(60_000, false)
		if len(doc) < 3<<20 {
			t.Fatalf("document is %d bytes, want several MiB", len(doc))
		}
		h1, err := idem.HashJSONBytes(doc)
		if err != nil {
			t.Fatal(err)
		}
		h2, err := idem.HashJSONBytes(hostileBigDoc(60_000, true))
		if err != nil || h2 != h1 {
			t.Fatalf("the same document respelled hashed %s (%v), want %s", h2, err, h1)
		}
		changed := append([]byte(nil), doc...)
		changed[bytes.LastIndex(changed, []byte(`"id":`))+len(`"id":`)]-- // the last id
		if h3, err := idem.HashJSONBytes(changed); err != nil || h3 == h1 {
			t.Fatalf("a one-byte change hashed %s (%v), want a different hash", h3, err)
		}
		// The body itself is also stored and replayed as the result.
		runs := 0
		big := string(doc)
		fn := func(pgx.Tx) (string, error) { runs++; return big, nil }
		keys, err := idem.NewClient(s.pool, &idem.Config{MaxResultBytes: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		first, err := idem.Do(ctx, keys, "huge", h1, fn)
		if err != nil || first != big {
			t.Fatalf("first call: %d bytes, %v", len(first), err)
		}
		again, err := idem.Do(ctx, keys, "huge", h1, fn)
		if err != nil || again != big || runs != 1 {
			t.Fatalf("replay: %d bytes (equal: %v), %v, runs %d", len(again), again == big, err, runs)
		}
	})

	deep := []struct {
		name string
		doc  []byte
	}{
		{"10k nested arrays", []byte(strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000))},
		{"10k nested objects", []byte(strings.Repeat(`{"a":`, 10_000) + "1" + strings.Repeat("}", 10_000))},
		{"10k unclosed arrays", []byte(strings.Repeat("[", 10_000))},
		{"1M nested arrays", []byte(strings.Repeat("[", 1_000_000) + strings.Repeat("]", 1_000_000))},
	}
	for _, tc := range deep {
		t.Run(tc.name, func(t *testing.T) {
			h, err := idem.HashJSONBytes(tc.doc)
			if err == nil {
				t.Fatalf("HashJSONBytes = %s, want an error", h)
			}
			if !strings.Contains(err.Error(), "nested deeper") && !strings.Contains(err.Error(), "EOF") {
				t.Fatalf("error %q does not say what was wrong", err)
			}
		})
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys WHERE status <> 'completed'"); n != 0 {
		t.Errorf("%d keys not completed", n)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 1 {
		t.Errorf("%d keys stored, want 1", n)
	}
}

// TestHostileExecModes runs a charge, a refusal and their replays in every
// pgx query exec mode. A pooler dictates the mode (PgBouncer in transaction
// pooling needs exec or simple_protocol), and the modes encode parameters
// differently: in exec and simple_protocol a []byte travels as bytea, so a
// JSON parameter must be sent as text.
func TestHostileExecModes(t *testing.T) {
	insufficient := idem.Refuse("insufficient_funds", "insufficient funds")
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			if u := os.Getenv("IDEM_TEST_DATABASE_URL"); strings.Contains(u, "default_query_exec_mode=") &&
				!strings.Contains(u, "default_query_exec_mode="+strings.ReplaceAll(mode.String(), " ", "_")) {
				t.Skip("the database URL fixes another exec mode (a pooler in front of the server)")
			}
			pool := testdb.New(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
			ctx := context.Background()
			if _, err := pool.Exec(ctx, bankSQL); err != nil {
				t.Fatal(err)
			}
			s := &setup{t: t, pool: pool}
			for _, v := range variants {
				runs := 0
				key := "charge-" + v.name + "-'\\💳"
				first, err := do(t, s, v, key, hostileHash, chargeFn(ctx, 5, &runs))
				if err != nil {
					t.Fatalf("%s: charge: %v", v.name, err)
				}
				again, replayed, err := runReplayed(ctx, pool, key, hostileHash, chargeFn(ctx, 5, &runs))
				if err != nil || again != first || !replayed || runs != 1 {
					t.Fatalf("%s: replay %+v, %v, replayed %v, runs %d; want %+v", v.name, again, err, replayed, runs, first)
				}
				refuse := func(tx pgx.Tx) (charge, error) {
					runs++
					return charge{Amount: 7}, insufficient
				}
				for i := range 2 {
					got, err := do(t, s, v, "refuse-"+v.name, hostileHash, refuse)
					if !errors.Is(err, insufficient) || got.Amount != 7 {
						t.Fatalf("%s: refusal call %d: %+v, %v; want the refusal and its value", v.name, i, got, err)
					}
				}
				if runs != 2 {
					t.Fatalf("%s: fn ran %d times, want 2 (one charge, one refusal)", v.name, runs)
				}
			}
			if s.charges() != len(variants) || s.keys("refused") != len(variants) || s.keys("in_progress") != 0 {
				t.Fatalf("charges %d, refused keys %d, in progress %d", s.charges(), s.keys("refused"), s.keys("in_progress"))
			}
		})
	}
}
