// Package citus_test runs idem's contract on a running Citus cluster: calls
// entering through the coordinator and through every worker, duplicates
// spread over the nodes, backends terminated on every node, an outcome left
// unknown, and operations made of steps. It needs IDEM_TEST_CITUS_URL (the
// coordinator, any database with the citus extension, metadata synced to
// the workers); without it every test skips. make test-citus runs it;
// docs/SCALING.md says how to point it at a cluster.
package citus_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/schema"
)

// envURL names the coordinator's URL; envNodes, when set, the URLs of the
// nodes to enter through (comma-separated), which are otherwise the
// coordinator and the active primaries of pg_dist_node, reached with the
// coordinator URL's user, password and database.
const (
	envURL   = "IDEM_TEST_CITUS_URL"
	envNodes = "IDEM_TEST_CITUS_NODES"
	appName  = "idem-citus-test"
)

// A node is one entry point of the cluster, with a pool whose sessions use
// the test's schema and log the commands Citus sends to other nodes.
type node struct {
	name string
	url  string
	pool *pgxpool.Pool
	log  *remoteLog
}

// cluster is one test's state: its own schema on the cluster, the business
// tables and the key tables distributed in it, and a pool per node.
type cluster struct {
	t      testing.TB
	schema string
	nodes  []*node
}

var schemaSeq atomic.Int64

func newCluster(t testing.TB) *cluster {
	t.Helper()
	coord := os.Getenv(envURL)
	if coord == "" {
		t.Skipf("%s is not set: these tests need a running Citus cluster (docs/SCALING.md, \"Testing on your cluster\")", envURL)
	}
	ctx := context.Background()
	urls, err := nodeURLs(ctx, coord)
	if err != nil {
		t.Fatalf("find the cluster's nodes from %s: %v", envURL, err)
	}
	c := &cluster{t: t, schema: fmt.Sprintf("idem_t%d_%d", os.Getpid(), schemaSeq.Add(1))}
	admin, err := pgx.Connect(ctx, coord)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	s := pgx.Identifier{c.schema}.Sanitize()
	setup := fmt.Sprintf(`
DROP SCHEMA IF EXISTS %[1]s CASCADE;
CREATE SCHEMA %[1]s;
SET search_path = %[1]s;
CREATE TABLE accounts (scope text NOT NULL, id bigint NOT NULL,
                       balance bigint NOT NULL CHECK (balance >= 0), PRIMARY KEY (scope, id));
SELECT create_distributed_table('accounts', 'scope');
CREATE TABLE charges (scope text NOT NULL, id bigserial, ref text NOT NULL,
                      amount bigint NOT NULL, PRIMARY KEY (scope, id));
SELECT create_distributed_table('charges', 'scope', colocate_with => 'accounts');
`, s)
	if _, err := admin.Exec(ctx, setup); err != nil {
		t.Fatalf("set up schema %s: %v", c.schema, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept schema %s on %s for inspection", c.schema, redact(coord))
			return
		}
		conn, err := pgx.Connect(context.Background(), coord)
		if err == nil {
			_, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+s+" CASCADE")
			_ = conn.Close(context.Background())
		}
	})
	for i, u := range urls {
		n := &node{name: nodeName(i, u), url: u, log: &remoteLog{}}
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 16
		cfg.ConnConfig.RuntimeParams["search_path"] = c.schema
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
		cfg.ConnConfig.RuntimeParams["citus.log_remote_commands"] = "on"
		cfg.ConnConfig.OnNotice = n.log.notice
		n.pool, err = pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.pool.Close)
		c.nodes = append(c.nodes, n)
	}
	if err := schema.ApplyDistributed(ctx, c.nodes[0].pool, "", "accounts"); err != nil {
		t.Fatal(err)
	}
	return c
}

// nodeURLs returns the URLs of the nodes to enter through: the coordinator
// first.
func nodeURLs(ctx context.Context, coord string) ([]string, error) {
	if v := os.Getenv(envNodes); v != "" {
		return strings.Split(v, ","), nil
	}
	u, err := url.Parse(coord)
	if err != nil {
		return nil, fmt.Errorf("%s must be a postgres:// URL unless %s lists the nodes: %w", envURL, envNodes, err)
	}
	conn, err := pgx.Connect(ctx, coord)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node
	                              WHERE isactive AND noderole = 'primary' AND groupid <> 0 ORDER BY groupid`)
	if err != nil {
		return nil, err
	}
	out := []string{coord}
	for rows.Next() {
		var host string
		var port int
		if err := rows.Scan(&host, &port); err != nil {
			return nil, err
		}
		w := *u
		w.Host = net.JoinHostPort(host, fmt.Sprint(port))
		out = append(out, w.String())
	}
	return out, rows.Err()
}

func nodeName(i int, u string) string {
	host := redact(u)
	if i == 0 {
		return "coordinator(" + host + ")"
	}
	return fmt.Sprintf("worker%d(%s)", i, host)
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "a node"
	}
	return p.Host
}

// tenant returns a scope whose shards live on the given worker (1-based,
// in pg_dist_node's order), so that a test can enter through a node that
// does not hold the tenant's shard.
func (c *cluster) tenantOn(worker int) string {
	c.t.Helper()
	u, err := url.Parse(c.nodes[worker].url)
	if err != nil {
		c.t.Fatal(err)
	}
	port := u.Port()
	for i := range 1000 {
		scope := fmt.Sprintf("tenant-%d", i)
		var p int
		err := c.nodes[0].pool.QueryRow(context.Background(), `
			SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('accounts', $1::text)
			LIMIT 1`, scope).Scan(&p)
		if err != nil {
			c.t.Fatal(err)
		}
		if fmt.Sprint(p) == port {
			return scope
		}
	}
	c.t.Fatalf("no tenant found on %s", c.nodes[worker].name)
	return ""
}

// open gives scope an account with a balance.
func (c *cluster) open(scope string, balance int64) {
	c.t.Helper()
	_, err := c.nodes[0].pool.Exec(context.Background(),
		"INSERT INTO accounts (scope, id, balance) VALUES ($1, 1, $2) ON CONFLICT (scope, id) DO UPDATE SET balance = excluded.balance",
		scope, balance)
	if err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) count(sql string, args ...any) int {
	c.t.Helper()
	var n int
	if err := c.nodes[0].pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		c.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// remoteLog keeps what Citus says it sends to other nodes
// (citus.log_remote_commands): the proof of where a call ran.
type remoteLog struct {
	mu      sync.Mutex
	on      bool
	entries []remoteCommand
}

type remoteCommand struct{ command, server string }

func (l *remoteLog) notice(_ *pgconn.PgConn, n *pgconn.Notice) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.on {
		return
	}
	cmd, ok := strings.CutPrefix(n.Message, "issuing ")
	if !ok {
		cmd, ok = strings.CutPrefix(n.Message, "executing the command locally: ")
		if !ok {
			return
		}
		l.entries = append(l.entries, remoteCommand{command: cmd, server: "local"})
		return
	}
	server := n.Detail
	if i := strings.Index(server, " connectionId"); i >= 0 {
		server = server[:i]
	}
	l.entries = append(l.entries, remoteCommand{command: cmd, server: strings.TrimPrefix(server, "on server ")})
}

// record starts keeping commands afresh; take stops and returns them.
func (l *remoteLog) record() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on, l.entries = true, nil
}

func (l *remoteLog) take() []remoteCommand {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = false
	return l.entries
}
