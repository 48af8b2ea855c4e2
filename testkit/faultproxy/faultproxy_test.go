package faultproxy_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/testkit/faultproxy"
	"github.com/idemhq/idem/testkit/testdb"
)

// setup is a database, a direct connection to it and a proxy in front of it.
type setup struct {
	direct  *pgx.Conn
	proxy   *faultproxy.Proxy
	proxied string // the database URL through the proxy
}

func newSetup(t *testing.T) setup {
	t.Helper()
	ctx := context.Background()
	u := testdb.URL(t)
	hp, err := testdb.HostPort(u)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(hp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	direct, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close(context.Background()) })
	if _, err := direct.Exec(ctx, "create table t (n int)"); err != nil {
		t.Fatal(err)
	}
	return setup{direct: direct, proxy: p, proxied: testdb.WithHostPort(u, p.Addr())}
}

func (s setup) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), s.proxied)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func (s setup) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := s.direct.QueryRow(context.Background(), "select count(*) from t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestFaultProxyPassThrough(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := s.connect(t)
	ctx := context.Background()
	for i := range 3 {
		if _, err := c.Exec(ctx, "insert into t values ($1)", i); err != nil {
			t.Fatal(err)
		}
	}
	var sum int
	if err := c.QueryRow(ctx, "select sum(n) from t").Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if sum != 3 || s.rows(t) != 3 {
		t.Fatalf("sum %d, rows %d; want 3, 3", sum, s.rows(t))
	}
	if s.proxy.Conns() != 1 || s.proxy.Cuts() != 0 {
		t.Fatalf("conns %d cuts %d; want 1, 0", s.proxy.Conns(), s.proxy.Cuts())
	}
}

func TestFaultProxySSLRequestIsRefused(t *testing.T) {
	t.Parallel()
	s := newSetup(t)

	raw, err := net.Dial("tcp", s.proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var req [8]byte
	binary.BigEndian.PutUint32(req[:4], 8)
	binary.BigEndian.PutUint32(req[4:], 80877103)
	if _, err := raw.Write(req[:]); err != nil {
		t.Fatal(err)
	}
	var answer [1]byte
	if _, err := io.ReadFull(raw, answer[:]); err != nil || answer[0] != 'N' {
		t.Fatalf("SSLRequest answered %q, %v; want 'N'", answer[0], err)
	}

	// A client that prefers TLS falls back to a plain connection.
	u := strings.Replace(s.proxied, "sslmode=disable", "sslmode=prefer", 1)
	c, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestFaultProxyCutBeforeStatementNeverRuns(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := s.connect(t)
	s.proxy.SetRule(faultproxy.Once(faultproxy.ClientSQL("insert into t"), faultproxy.CutBefore))
	_, err := c.Exec(context.Background(), "insert into t values (1)")
	if err == nil {
		t.Fatal("insert succeeded through a cut connection")
	}
	if n := s.rows(t); n != 0 {
		t.Fatalf("%d rows; the insert must not have reached the server", n)
	}
	if s.proxy.Cuts() != 1 {
		t.Fatalf("cuts %d; want 1", s.proxy.Cuts())
	}
	// The rule fired once: a new connection works.
	if _, err := s.connect(t).Exec(context.Background(), "insert into t values (2)"); err != nil {
		t.Fatal(err)
	}
}

func TestFaultProxyCutBeforeCommitAnswer(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := s.connect(t)
	ctx := context.Background()
	s.proxy.SetRule(faultproxy.Once(faultproxy.ServerTag("COMMIT"), faultproxy.CutBefore))
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "insert into t values (1)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("commit answered through a cut connection")
	}
	if n := s.rows(t); n != 1 {
		t.Fatalf("%d rows; the commit reached the server and must have committed", n)
	}
}

func TestFaultProxyBlackhole(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := s.connect(t)
	s.proxy.SetRule(faultproxy.Once(faultproxy.ServerType('D'), faultproxy.Blackhole))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var n int
	err := c.QueryRow(ctx, "select 42").Scan(&n)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v; want the deadline, as no answer arrives", err)
	}
	// Closing a connection sends Terminate and waits for the server to
	// hang up, which the blackhole prevents; CutAll ends the wait.
	s.proxy.CutAll()
	if err := c.Close(context.Background()); err != nil {
		t.Logf("close: %v", err)
	}
	if !c.IsClosed() {
		t.Fatal("the connection survived CutAll")
	}
}

// TestFaultProxyPartition: from the partition on nothing passes either way,
// and the server's close never reaches the client, which keeps waiting until
// CutAll.
func TestFaultProxyPartition(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := s.connect(t)
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "insert into t values (1)"); err != nil {
		t.Fatal(err)
	}
	pid := c.PgConn().PID()
	s.proxy.SetRule(faultproxy.Once(faultproxy.ClientSQL("insert"), faultproxy.Partition))
	done := make(chan error, 1)
	go func() {
		_, err := tx.Exec(ctx, "insert into t values (2)")
		done <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for s.proxy.Cuts() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the rule never fired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The server is left waiting for the second insert, idle in its
	// transaction. Ending the session there, as a timeout would, is hidden
	// from the client.
	var state string
	if err := s.direct.QueryRow(ctx, "select state from pg_stat_activity where pid = $1", pid).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != "idle in transaction" {
		t.Fatalf("the server's session is %q, want idle in transaction", state)
	}
	var gone bool
	if err := s.direct.QueryRow(ctx, "select pg_terminate_backend($1, 30000)", pid).Scan(&gone); err != nil || !gone {
		t.Fatalf("pg_terminate_backend: %v, %v", gone, err)
	}
	select {
	case err := <-done:
		t.Fatalf("the client saw the server's close through the partition: %v", err)
	default:
	}
	s.proxy.CutAll()
	if err := <-done; err == nil {
		t.Fatal("the insert succeeded through a partition")
	}
	if n := s.rows(t); n != 0 {
		t.Fatalf("%d rows; the server rolled the transaction back, want 0", n)
	}
}

func TestFaultProxyNthRoundTrip(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := s.connect(t)
	ctx := context.Background()
	// The connection's first ReadyForQuery ended the startup; the rule
	// counts from the next one.
	s.proxy.SetRule(faultproxy.Once(faultproxy.Nth(2, faultproxy.ServerType('Z')), faultproxy.CutAfter))
	for i, want := range []bool{true, true, false} {
		_, err := c.Exec(ctx, "insert into t values (1)")
		if (err == nil) != want {
			t.Fatalf("round trip %d: error %v, want success %v", i+1, err, want)
		}
	}
	if n := s.rows(t); n != 2 {
		t.Fatalf("%d rows; want 2", n)
	}
}

func TestFaultProxyMessagesCarrySQL(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := s.connect(t)
	ctx := context.Background()
	var seen []faultproxy.Message
	s.proxy.SetRule(func(m faultproxy.Message) faultproxy.Action {
		m.Body = nil
		seen = append(seen, m)
		return faultproxy.Pass
	})
	const q = "select $1::int"
	for range 2 { // the second run binds the prepared statement by name only
		var n int
		if err := c.QueryRow(ctx, q, 7).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.Exec(ctx, "select 1/0")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.DivisionByZero {
		t.Fatalf("got %v; want division by zero", err)
	}
	s.proxy.SetRule(nil)

	count := func(match func(faultproxy.Message) bool) int {
		n := 0
		for _, m := range seen {
			if match(m) {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		name  string
		match func(faultproxy.Message) bool
		want  int
	}{
		{"Parse", func(m faultproxy.Message) bool { return m.FromClient && m.Type == 'P' && m.SQL == q }, 1},
		{"Bind", func(m faultproxy.Message) bool { return m.FromClient && m.Type == 'B' && m.SQL == q }, 2},
		{"Execute", func(m faultproxy.Message) bool { return m.FromClient && m.Type == 'E' && m.SQL == q }, 2},
		{"DataRow", func(m faultproxy.Message) bool { return !m.FromClient && m.Type == 'D' && m.SQL == q }, 2},
		{"CommandComplete", func(m faultproxy.Message) bool { return !m.FromClient && m.Tag == "SELECT 1" && m.SQL == q }, 2},
		{"ErrorResponse", func(m faultproxy.Message) bool {
			return !m.FromClient && m.Type == 'E' && m.SQLState == pgerrcode.DivisionByZero
		}, 1},
		{"ReadyForQuery", func(m faultproxy.Message) bool { return !m.FromClient && m.Type == 'Z' && m.TxStatus == 'I' }, 4},
	} {
		if got := count(c.match); got != c.want {
			t.Errorf("%s: %d messages, want %d; saw %v", c.name, got, c.want, seen)
		}
	}
}

func TestFaultProxyCancelRequestPassesThrough(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := s.connect(t)
	sent := make(chan struct{})
	var once sync.Once
	s.proxy.SetRule(func(m faultproxy.Message) faultproxy.Action {
		if faultproxy.ClientSQL("select pg_sleep")(m) {
			once.Do(func() { close(sent) })
		}
		return faultproxy.Pass
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "select pg_sleep(60)")
		done <- err
	}()
	<-sent
	// A cancel that arrives before the query starts is ignored by the
	// server, so keep asking until the query ends.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.QueryCanceled {
				t.Fatalf("got %v; want the query cancelled through the proxy", err)
			}
			return
		case <-tick.C:
			if err := c.PgConn().CancelRequest(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestFaultProxyCloseEndsConnections(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c := s.connect(t)
	if err := s.proxy.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(context.Background()); err == nil {
		t.Fatal("ping succeeded through a closed proxy")
	}
	if _, err := pgx.Connect(context.Background(), s.proxied); err == nil {
		t.Fatal("connected through a closed proxy")
	}
}

func TestFaultProxyStripComments(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"commit", "commit"},
		{"  \n\tBEGIN", "BEGIN"},
		{"-- claim: one statement\n-- more\nWITH cur AS (", "WITH cur AS ("},
		{"/* a */ /* b */select 1", "select 1"},
		{"-- only a comment", ""},
		{"/* unterminated", ""},
	} {
		if got := faultproxy.StripComments(c.in); got != c.want {
			t.Errorf("StripComments(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestFaultProxyCutsOversizeMessage(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	c, err := pgx.Connect(context.Background(), s.proxied)
	if err != nil {
		t.Fatal(err)
	}
	hj, err := c.PgConn().Hijack()
	if err != nil {
		t.Fatal(err)
	}
	raw := hj.Conn
	defer raw.Close()
	// A Query announcing 100 MiB: the server would wait for the body; the
	// proxy refuses to buffer it and cuts.
	hdr := []byte{'Q', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(hdr[1:], 100<<20)
	if _, err := raw.Write(hdr); err != nil {
		t.Fatal(err)
	}
	if err := raw.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	_, err = raw.Read(make([]byte, 1))
	var netErr net.Error
	if err == nil || errors.As(err, &netErr) && netErr.Timeout() {
		t.Fatalf("read %v; want the connection closed", err)
	}
}
