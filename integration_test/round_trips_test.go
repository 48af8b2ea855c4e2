package integration_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// tripCounter counts the round trips a client starts, as the fault proxy
// sees them on the wire: every Sync of the extended protocol and every
// simple Query ends a request the client then waits on. A pool's liveness
// ping ("-- ping", sent when a connection idled for a second) is not the
// call's and is left out.
type tripCounter struct {
	mu    sync.Mutex
	trips []string
}

func (c *tripCounter) rule() faultproxy.Rule {
	var pending []string // SQL of the messages since the last Sync
	return func(m faultproxy.Message) faultproxy.Action {
		if !m.FromClient {
			return faultproxy.Pass
		}
		switch m.Type {
		case 'P', 'B':
			if m.SQL != "" && (len(pending) == 0 || pending[len(pending)-1] != m.SQL) {
				pending = append(pending, abbreviateSQL(m.SQL))
			}
		case 'S':
			c.add(strings.Join(pending, "; "))
			pending = nil
		case 'Q':
			if strings.TrimSpace(m.SQL) != "-- ping" {
				c.add(abbreviateSQL(m.SQL))
			}
		}
		return faultproxy.Pass
	}
}

func (c *tripCounter) add(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips = append(c.trips, what)
}

// take returns the round trips counted since the last take.
func (c *tripCounter) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.trips
	c.trips = nil
	return t
}

func abbreviateSQL(sql string) string {
	sql = strings.Join(strings.Fields(faultproxy.StripComments(sql)), " ")
	if len(sql) > 40 {
		sql = sql[:40] + "…"
	}
	return sql
}

// TestRoundTrips holds the performance promise on the wire: on a pool or a
// connection, a first execution costs the round trips of the bare
// transaction doing the same work (the claim travels with BEGIN, the stored
// result with COMMIT), and a replay is one round trip: the failed assertion
// ends the pipeline, so no ROLLBACK follows. Both hold at every isolation
// level: WithTxOptions' modes travel in the claim's pipeline too, and the
// next first execution on the connection after a replay still costs what
// the bare transaction costs (nothing had to be prepared again).
func TestRoundTrips(t *testing.T) {
	isolations := []pgx.TxIsoLevel{"", pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	for _, path := range []string{"pool", "conn"} {
		for _, iso := range isolations {
			name := path + "/" + strings.ReplaceAll(string(iso), " ", "_")
			if iso == "" {
				name = path + "/default"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				roundTrips(t, path, iso)
			})
		}
	}
}

func roundTrips(t *testing.T, path string, iso pgx.TxIsoLevel) {
	l := newLedger(t)
	ctx := context.Background()
	var db interface {
		idem.Beginner
		BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error)
	}
	if path == "pool" {
		db = l.pool(func(c *pgxpool.Config) { c.MaxConns = 1 })
	} else {
		db = l.conn()
	}
	txOpts := pgx.TxOptions{IsoLevel: iso}
	var opts []idem.Option
	if iso != "" {
		opts = append(opts, idem.WithTxOptions(txOpts))
	}
	work := func(tx pgx.Tx) (int64, error) {
		var balance int64
		err := tx.QueryRow(ctx, "update accounts set balance = balance + $1 where id = $2 returning balance", 1, 7).Scan(&balance)
		return balance, err
	}
	bare := func() error {
		return pgx.BeginTxFunc(ctx, db, txOpts, func(tx pgx.Tx) error { _, err := work(tx); return err })
	}
	replay := func(key string) (int64, error) {
		v, outcome, err := idem.Run(ctx, db, key, ledgerHash, func(_ context.Context, tx pgx.Tx) (int64, error) { return work(tx) }, opts...)
		if err == nil && outcome != idem.OutcomeReplayed {
			err = fmt.Errorf("%s: outcome %v, want replayed", key, outcome)
		}
		return v, err
	}
	// Warm the connection: the first use of each statement prepares it.
	if err := bare(); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, db, "k-warm", ledgerHash, work, opts...); err != nil {
		t.Fatal(err)
	}
	if _, err := replay("k-warm"); err != nil {
		t.Fatal(err)
	}

	var c tripCounter
	l.proxy.SetRule(c.rule())
	defer l.proxy.SetRule(nil)
	if err := bare(); err != nil {
		t.Fatal(err)
	}
	bareTrips := c.take()
	first, err := idem.Do(ctx, db, "k-1", ledgerHash, work, opts...)
	if err != nil {
		t.Fatal(err)
	}
	firstTrips := c.take()
	again, err := replay("k-1")
	if err != nil || again != first {
		t.Fatalf("replay: %d, %v; want %d replayed", again, err, first)
	}
	replayTrips := c.take()
	if _, err := idem.Do(ctx, db, "k-2", ledgerHash, work, opts...); err != nil {
		t.Fatal(err)
	}
	nextTrips := c.take()

	// A key that completed long after its claim lives until
	// completed_at + TTL, past its expires_at: its replay is a pure
	// read too, answered from the claim's own snapshot.
	if _, err := l.admin.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '25 hours',
		expires_at = now() - interval '1 hour', completed_at = now() - interval '1 minute' WHERE idempotency_key = 'k-1'`); err != nil {
		t.Fatal(err)
	}
	late, err := replay("k-1")
	if err != nil || late != first {
		t.Fatalf("replay of a key past its expires_at, within completed_at + TTL: %d, %v; want %d replayed", late, err, first)
	}
	lateTrips := c.take()

	t.Logf("bare transaction: %s", show(bareTrips))
	t.Logf("first execution:  %s", show(firstTrips))
	t.Logf("replay:           %s", show(replayTrips))
	if len(firstTrips) != len(bareTrips) {
		t.Errorf("a first execution took %d round trips, the bare transaction %d:\n  Do:   %s\n  bare: %s",
			len(firstTrips), len(bareTrips), show(firstTrips), show(bareTrips))
	}
	if len(replayTrips) != 1 {
		t.Errorf("a replay took %d round trips, want 1 (a failed assertion ends the pipeline without a ROLLBACK): %s",
			len(replayTrips), show(replayTrips))
	}
	if len(nextTrips) != len(bareTrips) {
		t.Errorf("the first execution after a replay took %d round trips, the bare transaction %d (did the replay's failed pipeline make statements be prepared again?): %s",
			len(nextTrips), len(bareTrips), show(nextTrips))
	}
	if len(lateTrips) != 1 {
		t.Errorf("the replay of a key that completed after its expires_at took %d round trips, want 1 (does the claim see it as live, by completed_at + TTL?): %s",
			len(lateTrips), show(lateTrips))
	}
}

func show(trips []string) string {
	var b strings.Builder
	for i, t := range trips {
		fmt.Fprintf(&b, "[%d] %s  ", i+1, t)
	}
	return b.String()
}

// TestRoundTripsInAnOuterTransaction holds the cost of a call inside the
// caller's transaction (Client.On(tx), as a batch of messages uses it): its
// savepoint travels with the claim and its release with the completion, so
// a first execution costs the work's own round trips and two more (the
// claim's and the completion's), never a round trip for SAVEPOINT or
// RELEASE alone, and the key commits with the outer transaction.
func TestRoundTripsInAnOuterTransaction(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	pool := l.pool(func(c *pgxpool.Config) { c.MaxConns = 1 })
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	work := func(tx pgx.Tx) (int64, error) {
		var balance int64
		err := tx.QueryRow(ctx, "update accounts set balance = balance + $1 where id = $2 returning balance", 1, 7).Scan(&balance)
		return balance, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Warm the connection: the first use of each statement prepares it.
	if _, err := idem.Do(ctx, keys.On(tx), "k-warm", ledgerHash, work); err != nil {
		t.Fatal(err)
	}
	var c tripCounter
	l.proxy.SetRule(c.rule())
	defer l.proxy.SetRule(nil)
	if _, err := work(tx); err != nil {
		t.Fatal(err)
	}
	workTrips := c.take()
	if _, err := idem.Do(ctx, keys.On(tx), "k-1", ledgerHash, work); err != nil {
		t.Fatal(err)
	}
	firstTrips := c.take()
	l.proxy.SetRule(nil)
	t.Logf("the work alone:  %s", show(workTrips))
	t.Logf("first execution: %s", show(firstTrips))
	if len(firstTrips) != len(workTrips)+2 {
		t.Errorf("a first execution in an outer transaction took %d round trips, the work alone %d; want the work's and two more:\n  Do:   %s\n  work: %s",
			len(firstTrips), len(workTrips), show(firstTrips), show(workTrips))
	}
	if err := idem.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := pool.QueryRow(ctx, "select count(*) from idempotency_keys where idempotency_key in ('k-warm', 'k-1') and status = 'completed'").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 2 {
		t.Fatalf("%d keys completed after the outer COMMIT, want 2", rows)
	}
}
