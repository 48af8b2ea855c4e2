package integration_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// ownBeginner is a Beginner that is neither a pool, a connection nor a
// transaction: Do takes its path through Begin (nested.go) and owns the
// transaction it begins.
type ownBeginner struct{ pool *pgxpool.Pool }

func (b ownBeginner) Begin(ctx context.Context) (pgx.Tx, error) { return b.pool.Begin(ctx) }

// partitionTimeout is Config.IdleTimeout in the partition tests: small, so
// the tests are quick; the bound they check is this plus slack for a loaded
// machine.
const partitionTimeout = 2 * time.Second

// partitionSlack is how much longer than Config.IdleTimeout a retry may wait
// for the server to free a silent caller's key before the test fails.
const partitionSlack = 10 * time.Second

// retryThroughHold retries key through db with a bounded wait, as a client
// polling with the same key does, and returns the answer and how long it
// took. It fails the test unless the retry ran fn within the bound.
func retryThroughHold(t *testing.T, db idem.Beginner, key string, fn func(pgx.Tx) (receipt, error)) (receipt, time.Duration) {
	t.Helper()
	bound := partitionTimeout + partitionSlack
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	start := time.Now()
	r, outcome, err := idem.Run(ctx, db, key, ledgerHash, func(_ context.Context, tx pgx.Tx) (receipt, error) { return fn(tx) }, idem.WithWait(bound))
	took := time.Since(start)
	if err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("retry after %v: %v, outcome %v; want fn run within %v (Config.IdleTimeout %v)", took.Round(time.Millisecond), err, outcome, bound, partitionTimeout)
	}
	return r, took
}

// TestFaultPartition: the network between the caller and PostgreSQL goes
// silent while fn runs, after its first write, without a reset in either
// direction. With Config.IdleTimeout the server ends the caller's session
// once it has waited that long for the next statement; a retry from another
// connection then runs fn, while the first caller is still waiting. The
// first attempt's write is rolled back and one charge commits.
func TestFaultPartition(t *testing.T) {
	for _, path := range []string{"pool", "conn", "beginner"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			l := newLedger(t)
			bg := context.Background()
			const key, account, amount = "k-partition", 1, 100
			cfg := &idem.Config{IdleTimeout: partitionTimeout}
			var db idem.Beginner
			switch path {
			case "pool":
				db = l.pool()
			case "conn":
				db = l.conn()
			default:
				db = ownBeginner{l.pool()}
			}
			base, err := idem.NewClient(l.pool(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			keys := base.On(db)
			retryKeys, err := idem.NewClient(l.directPool(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			// Warm up, so the faulty call sends only Bind and Execute.
			if _, err := idem.Do(bg, keys, "k-warm", ledgerHash, chargeWork(bg, "k-warm", 0, 1, nil)); err != nil {
				t.Fatal(err)
			}

			var firstCharge atomic.Int64
			first := func(tx pgx.Tx) (receipt, error) {
				var r receipt
				if err := tx.QueryRow(bg,
					"insert into charges (account_id, amount, idem_key) values ($1, $2, $3) returning id",
					account, amount, key).Scan(&r.ChargeID); err != nil {
					return r, err
				}
				firstCharge.Store(r.ChargeID)
				err := tx.QueryRow(bg,
					"update accounts set balance = balance + $2 where id = $1 returning balance",
					account, amount).Scan(&r.Balance)
				return r, err
			}
			l.proxy.SetRule(faultproxy.Once(faultproxy.ClientSQL("update accounts"), faultproxy.Partition))
			done := make(chan error, 1)
			go func() {
				// No deadline: the caller waits as long as the partition
				// lasts, as a process whose network went silent does.
				_, err := idem.Do(bg, keys, key, ledgerHash, first)
				done <- err
			}()
			waitFor(t, "the partition", func() bool { return l.proxy.Cuts() == 1 })

			var runs atomic.Int64
			again, took := retryThroughHold(t, retryKeys, key, chargeWork(bg, key, account, amount, &runs))
			select {
			case err := <-done:
				t.Fatalf("the first call returned (%v) before the retry; the partition must hold it", err)
			default:
			}
			l.proxy.CutAll() // the partition ends; the first caller learns
			firstErr := <-done
			definite(t, firstErr)
			if !idem.Retryable(firstErr) {
				t.Fatalf("first call: %v, want a retryable error", firstErr)
			}
			if runs.Load() != 1 {
				t.Fatalf("the retry ran fn %d times, want 1", runs.Load())
			}
			l.exactlyOnce(key, account, amount, again)
			if id := firstCharge.Load(); id == 0 || l.chargeExists(id) {
				t.Fatalf("the first attempt's charge %d: recorded %v, committed %v; want rolled back", id, id != 0, l.chargeExists(id))
			}
			t.Logf("%s: key freed and fn run by the retry %v after the partition (IdleTimeout %v); first call: %v",
				path, took.Round(time.Millisecond), partitionTimeout, firstErr)
		})
	}
}

// TestFaultFrozenCaller: the caller's process stops between two statements
// of fn (a pause, a stuck call to another service) while its connection
// stays healthy, which TCP keepalives never detect. The server ends the
// session after Config.IdleTimeout; a retry runs fn; the frozen caller, when
// it resumes, gets a retryable error and nothing of its attempt commits.
func TestFaultFrozenCaller(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	bg := context.Background()
	const key, account, amount = "k-frozen", 1, 100
	cfg := &idem.Config{IdleTimeout: partitionTimeout}
	keys, err := idem.NewClient(l.directPool(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	inserted, resume := make(chan int64, 1), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idem.Do(bg, keys, key, ledgerHash, func(tx pgx.Tx) (receipt, error) {
			var r receipt
			if err := tx.QueryRow(bg,
				"insert into charges (account_id, amount, idem_key) values ($1, $2, $3) returning id",
				account, amount, key).Scan(&r.ChargeID); err != nil {
				inserted <- 0
				return r, err
			}
			inserted <- r.ChargeID
			<-resume
			err := tx.QueryRow(bg,
				"update accounts set balance = balance + $2 where id = $1 returning balance",
				account, amount).Scan(&r.Balance)
			return r, err
		})
		done <- err
	}()
	firstCharge := <-inserted
	if firstCharge == 0 {
		t.Fatal("the first attempt's insert failed")
	}

	var runs atomic.Int64
	again, took := retryThroughHold(t, keys, key, chargeWork(bg, key, account, amount, &runs))
	close(resume)
	firstErr := <-done
	definite(t, firstErr)
	if !idem.Retryable(firstErr) {
		t.Fatalf("the resumed call: %v (SQLSTATE %q), want a retryable error", firstErr, pgCode(firstErr))
	}
	l.exactlyOnce(key, account, amount, again)
	if l.chargeExists(firstCharge) {
		t.Fatalf("the frozen attempt's charge %d committed", firstCharge)
	}
	t.Logf("key freed and fn run by the retry %v after the caller froze (IdleTimeout %v); the resumed call got %v",
		took.Round(time.Millisecond), partitionTimeout, firstErr)
}

// TestIdleTimeoutIsLocal: the setting holds for exactly the call's own
// transaction on every path: fn sees it; a replay, a refusal, a failure and
// a mismatch leave the pooled connection's session as it was; an outer
// transaction is left alone.
func TestIdleTimeoutIsLocal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One connection, so every statement below runs in the same session.
	s := newSetup(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	session := func() string {
		t.Helper()
		var v string
		if err := s.pool.QueryRow(ctx, "show idle_in_transaction_session_timeout").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	baseline := session()
	inside := func(tx pgx.Tx) (string, error) {
		var v string
		err := tx.QueryRow(ctx, "select current_setting('idle_in_transaction_session_timeout')").Scan(&v)
		return v, err
	}
	newClient := func(db idem.Beginner, cfg *idem.Config) idem.Beginner {
		t.Helper()
		c, err := idem.NewClient(s.pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c.On(db)
	}
	n := 0
	// check runs a call and every way a key can be answered afterwards, and
	// checks what fn saw and that the session kept its own value.
	check := func(name string, db idem.Beginner, want string, opts ...idem.Option) {
		t.Helper()
		n++
		key := name
		got, err := idem.Do(ctx, db, key, "h", inside, opts...)
		if err != nil || got != want {
			t.Fatalf("%s: fn saw %q (%v), want %q", name, got, err, want)
		}
		if v := session(); v != baseline {
			t.Fatalf("%s: after the call the session has %q, want %q", name, v, baseline)
		}
		if got, outcome, err := idem.Run(ctx, db, key, "h", func(context.Context, pgx.Tx) (string, error) {
			return "", errors.New("fn ran for a replay")
		}, opts...); err != nil || outcome != idem.OutcomeReplayed || got != want {
			t.Fatalf("%s: replay %q %v %v", name, got, outcome, err)
		}
		if _, err := idem.Do(ctx, db, key, "other", inside, opts...); !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("%s: mismatch: %v", name, err)
		}
		if _, err := idem.Do(ctx, db, key+"-failed", "h", func(pgx.Tx) (string, error) {
			return "", errors.New("fn failed")
		}, opts...); err == nil {
			t.Fatalf("%s: a failing fn succeeded", name)
		}
		if _, err := idem.Do(ctx, db, key+"-refused", "h", func(pgx.Tx) (string, error) {
			return "", idem.Refuse("declined", "")
		}, opts...); !errors.Is(err, idem.Refuse("declined", "")) {
			t.Fatalf("%s: refusal: %v", name, err)
		}
		if v := session(); v != baseline {
			t.Fatalf("%s: after a replay, a mismatch, a failure and a refusal the session has %q, want %q", name, v, baseline)
		}
	}
	cfg := &idem.Config{IdleTimeout: 1500 * time.Millisecond}
	check("default", s.pool, "1min")
	check("pool", newClient(s.pool, cfg), "1500ms")
	check("pool_serializable", newClient(s.pool, cfg), "1500ms",
		idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable})) // BEGIN first
	check("beginner", newClient(ownBeginner{s.pool}, cfg), "1500ms")
	check("disabled", newClient(s.pool, &idem.Config{IdleTimeout: -1}), baseline)
	// A microsecond rounds up to 1ms, never down to 0 (which would turn the
	// timeout off). fn reads it, unless the server has already ended the
	// session for idling that long between the pipeline and fn's query: on a
	// loaded machine that happens, and it shows the timeout is armed too.
	tiny := newClient(s.pool, &idem.Config{IdleTimeout: time.Microsecond})
	got, err := idem.Do(ctx, tiny, "rounded_up", "h", inside)
	var pgErr *pgconn.PgError
	switch {
	case err == nil && got == "1ms":
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.IdleInTransactionSessionTimeout:
	default:
		t.Fatalf("rounded_up: fn saw %q (%v), want 1ms or the session ended by the timeout", got, err)
	}

	// An outer transaction keeps its own setting, during and after the call.
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "set local idle_in_transaction_session_timeout = '7s'"); err != nil {
		t.Fatal(err)
	}
	got, err = idem.Do(ctx, newClient(tx, cfg), "outer", "h", inside)
	if err != nil || got != "7s" {
		t.Fatalf("outer: fn saw %q (%v), want the outer transaction's 7s", got, err)
	}
	if after, err := inside(tx); err != nil || after != "7s" {
		t.Fatalf("outer: after the call the outer transaction has %q (%v), want 7s", after, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if v := session(); v != baseline {
		t.Fatalf("outer: after the commit the session has %q, want %q", v, baseline)
	}
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// chargeExists reports whether a charge with id is committed.
func (l *ledger) chargeExists(id int64) bool {
	l.t.Helper()
	var ok bool
	if err := l.admin.QueryRow(context.Background(), "select exists (select 1 from charges where id = $1)", id).Scan(&ok); err != nil {
		l.t.Fatal(err)
	}
	return ok
}
