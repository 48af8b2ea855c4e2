package integration_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
	"github.com/idemhq/idem/testkit/testdb"
)

// ledgerSQL is the business schema of the fault and isolation tests: a
// charge is a row in charges plus a balance update, tagged with its key so a
// test can count the effects of one key without a unique constraint doing
// the work for idem.
const ledgerSQL = `
CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
CREATE TABLE charges (
    id         bigserial PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES accounts (id),
    amount     bigint NOT NULL,
    idem_key   text   NOT NULL
);
INSERT INTO accounts (id) SELECT generate_series(0, 511);
`

// ledgerHash is the request hash of every charge in these tests.
const ledgerHash = "charge-v1"

// ledger is one test's database: admin reaches it directly, to observe and
// to play the other sessions; proxied goes through a fault proxy.
type ledger struct {
	t       *testing.T
	url     string
	admin   *pgxpool.Pool
	proxy   *faultproxy.Proxy
	proxied string
}

func newLedger(t *testing.T) *ledger {
	t.Helper()
	ctx := context.Background()
	u := testdb.URL(t)
	admin, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := admin.Exec(ctx, ledgerSQL); err != nil {
		t.Fatal(err)
	}
	hp, err := testdb.HostPort(u)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(hp)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after admin.Close, so it runs before it: connections
	// through the proxy end first.
	t.Cleanup(func() { p.Close() })
	return &ledger{t: t, url: u, admin: admin, proxy: p, proxied: testdb.WithHostPort(u, p.Addr())}
}

// pool returns a pool through the proxy, closed when the test ends.
func (l *ledger) pool(configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	l.t.Helper()
	return l.newPool(l.proxied, configure...)
}

// newPool returns a pool on url, closed when the test ends.
func (l *ledger) newPool(url string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	l.t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		l.t.Fatal(err)
	}
	for _, f := range configure {
		f(cfg)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(p.Close)
	return p
}

// conn returns a connection through the proxy, closed when the test ends.
func (l *ledger) conn() *pgx.Conn {
	l.t.Helper()
	c, err := pgx.Connect(context.Background(), l.proxied)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// receipt is what a charge returns and idem stores.
type receipt struct {
	ChargeID int64 `json:"charge_id"`
	Balance  int64 `json:"balance"`
}

// chargeWork charges amount to account under key: it inserts the charge,
// then updates the balance. runs counts how often it was entered.
func chargeWork(ctx context.Context, key string, account, amount int64, runs *atomic.Int64) func(pgx.Tx) (receipt, error) {
	return func(tx pgx.Tx) (receipt, error) {
		if runs != nil {
			runs.Add(1)
		}
		var r receipt
		if err := tx.QueryRow(ctx,
			"insert into charges (account_id, amount, idem_key) values ($1, $2, $3) returning id",
			account, amount, key).Scan(&r.ChargeID); err != nil {
			return r, err
		}
		err := tx.QueryRow(ctx,
			"update accounts set balance = balance + $2 where id = $1 returning balance",
			account, amount).Scan(&r.Balance)
		return r, err
	}
}

// retryKey calls Do with key through db until it succeeds, as a client does
// after a failure: every error on the way must be retryable. It returns the
// answer, the number of calls and whether the answer was a replay.
func retryKey(t *testing.T, db idem.Beginner, key string, fn func(pgx.Tx) (receipt, error)) (receipt, int, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for calls := 1; ; calls++ {
		// A backend cut off from its client may hold the key for a moment
		// before it notices; WithWait rides that out.
		r, replayed, err := runReplayed(ctx, db, key, ledgerHash, fn, idem.WithWait(time.Minute))
		if err == nil {
			return r, calls, replayed
		}
		if !idem.Retryable(err) || calls == 20 {
			t.Fatalf("retry %d of %s: %v (retryable %v)", calls, key, err, idem.Retryable(err))
		}
	}
}

// exactlyOnce asserts the invariants after a key settled: one charge for
// key, the balance of account holds exactly that charge, every answer given
// equals what was committed, and no key of the database is in progress.
func (l *ledger) exactlyOnce(key string, account, amount int64, answers ...receipt) {
	l.t.Helper()
	ctx := context.Background()
	var n int
	var id, sum int64
	if err := l.admin.QueryRow(ctx,
		"select count(*), coalesce(max(id), 0), coalesce(sum(amount), 0) from charges where idem_key = $1",
		key).Scan(&n, &id, &sum); err != nil {
		l.t.Fatal(err)
	}
	if n != 1 {
		l.t.Fatalf("key %s: %d charges committed, want 1", key, n)
	}
	var balance int64
	if err := l.admin.QueryRow(ctx, "select balance from accounts where id = $1", account).Scan(&balance); err != nil {
		l.t.Fatal(err)
	}
	if balance != amount || sum != amount {
		l.t.Fatalf("key %s: balance %d, charged %d, want %d", key, balance, sum, amount)
	}
	want := receipt{ChargeID: id, Balance: balance}
	for i, a := range answers {
		if a != want {
			l.t.Fatalf("key %s: answer %d is %+v, committed %+v", key, i, a, want)
		}
	}
	var status string
	if err := l.admin.QueryRow(ctx, "select status from idempotency_keys where idempotency_key = $1", key).Scan(&status); err != nil {
		l.t.Fatalf("key %s: %v", key, err)
	}
	if status != "completed" {
		l.t.Fatalf("key %s: status %s, want completed", key, status)
	}
	if in := l.inProgress(); in != 0 {
		l.t.Fatalf("%d keys left in_progress", in)
	}
}

func (l *ledger) inProgress() int {
	l.t.Helper()
	var n int
	if err := l.admin.QueryRow(context.Background(),
		"select count(*) from idempotency_keys where status = 'in_progress'").Scan(&n); err != nil {
		l.t.Fatal(err)
	}
	return n
}

// committed reports whether key has a committed row, and how many charges.
func (l *ledger) committed(key string) (keyRow bool, charges int) {
	l.t.Helper()
	ctx := context.Background()
	if err := l.admin.QueryRow(ctx,
		"select exists (select 1 from idempotency_keys where idempotency_key = $1), (select count(*) from charges where idem_key = $1)",
		key).Scan(&keyRow, &charges); err != nil {
		l.t.Fatal(err)
	}
	return keyRow, charges
}

// noTrace asserts that key left nothing committed.
func (l *ledger) noTrace(key string) {
	l.t.Helper()
	if keyRow, charges := l.committed(key); keyRow || charges != 0 {
		l.t.Fatalf("key %s: key row %v, %d charges; want none", key, keyRow, charges)
	}
}

// definite asserts that err is a failure that says nothing committed.
func definite(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("the call succeeded through the fault")
	}
	if errors.Is(err, idem.ErrOutcomeUnknown) {
		t.Fatalf("%v: a failure before COMMIT was sent must not be ErrOutcomeUnknown", err)
	}
}

// unknown asserts that err says the outcome is unknown and is retryable.
func unknown(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, idem.ErrOutcomeUnknown) || !idem.Retryable(err) {
		t.Fatalf("got %v (retryable %v); want ErrOutcomeUnknown, retryable", err, idem.Retryable(err))
	}
}
