package integration_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/idem"
)

// A scope that does not fit a key's namespace is bad input: it comes back as
// an error from every entry point, never as a panic, and nothing reaches the
// database.
func TestInvalidScopeIsAnError(t *testing.T) {
	t.Parallel()
	pool, sent := hostileTracedPool(t)
	userID := strings.Repeat("u", 300) // a principal longer than a scope may be
	ctx := idem.ContextWithScope(context.Background(), userID)
	fn := func(pgx.Tx) (int, error) { return 1, nil }

	if _, err := idem.Do(ctx, pool, "k", "h", fn); !errors.Is(err, idem.ErrInvalidScope) {
		t.Fatalf("Do with a 300-byte context scope: %v, want ErrInvalidScope", err)
	}
	// Wrap is built once; the scope arrives per request.
	charge := idem.Wrap(pool, "payments.charge", shop{}.Charge)
	if _, _, err := charge(ctx, "k", chargeRequest{AccountID: 1, Amount: 1}); !errors.Is(err, idem.ErrInvalidScope) {
		t.Fatalf("a Wrap'd call with a 300-byte scope: %v, want ErrInvalidScope", err)
	}
	// An operation and a scope that fit alone but not together.
	long := idem.ContextWithScope(context.Background(), strings.Repeat("s", 250))
	if _, _, err := charge(long, "k", chargeRequest{AccountID: 1, Amount: 1}); !errors.Is(err, idem.ErrInvalidScope) {
		t.Fatalf("operation + scope over 255 bytes: %v, want ErrInvalidScope", err)
	}
	if n := sent.n.Load(); n != 0 {
		t.Fatalf("%d statements reached the database", n)
	}
}

// The scope in the context namespaces keys for Do and Wrap alike, so one
// decorator serves every tenant.
func TestScopeFromContext(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	charge := idem.Wrap(s.pool, "payments.charge", shop{}.Charge)
	req := chargeRequest{AccountID: 1, Amount: 10}
	for i, tenant := range []string{"tenant-a", "tenant-b", "tenant-a"} {
		ctx := idem.ContextWithScope(context.Background(), tenant)
		_, outcome, err := charge(ctx, "same-key", req)
		if err != nil {
			t.Fatal(err)
		}
		if want := []idem.Outcome{idem.OutcomeExecuted, idem.OutcomeExecuted, idem.OutcomeReplayed}[i]; outcome != want {
			t.Fatalf("call %d (%s): outcome %v, want %v", i+1, tenant, outcome, want)
		}
	}
	if n := s.charges(); n != 2 {
		t.Fatalf("%d charges, want 2: one per tenant, the third call a replay", n)
	}
	runs := 0
	for _, tenant := range []string{"x", "y", "x"} {
		ctx := idem.ContextWithScope(context.Background(), tenant)
		if _, err := idem.Do(ctx, s.pool, "k", "h", chargeFn(ctx, 1, &runs)); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 2 {
		t.Fatalf("Do ran %d times, want 2", runs)
	}
}

// Inside the work, the context carries the call's key, from which a
// downstream key is derived: the same on every attempt, different per scope
// and purpose.
func TestKeyInsideTheWork(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := idem.ContextWithScope(context.Background(), "tenant-1")
	var seen []idem.CallKey
	var derived []string
	fail := true
	work := func(ctx context.Context, tx pgx.Tx) (string, error) {
		k, ok := idem.KeyFromContext(ctx)
		if !ok {
			return "", errors.New("no key in the work's context")
		}
		seen = append(seen, k)
		d, err := idem.DeriveKey(ctx, "charge")
		if err != nil {
			return "", err
		}
		derived = append(derived, d)
		if fail {
			fail = false
			return "", errors.New("the processor timed out") // rolled back; the retry runs again
		}
		return d, nil
	}
	if _, _, err := idem.Run(ctx, s.pool, "order-42", "h", work); err == nil {
		t.Fatal("the first attempt should fail")
	}
	got, outcome, err := idem.Run(ctx, s.pool, "order-42", "h", work)
	if err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("retry: %v, %v", outcome, err)
	}
	if len(seen) != 2 || seen[0] != (idem.CallKey{Scope: "tenant-1", Key: "order-42"}) || seen[1] != seen[0] {
		t.Fatalf("keys seen inside the work: %+v", seen)
	}
	if derived[0] != derived[1] || got != derived[0] || len(got) != 36 {
		t.Fatalf("derived keys %v (returned %q): want one stable UUID", derived, got)
	}
	for _, other := range []string{
		idem.CallKey{Scope: "tenant-2", Key: "order-42"}.Derive("charge"),
		idem.CallKey{Scope: "tenant-1", Key: "order-43"}.Derive("charge"),
		idem.CallKey{Scope: "tenant-1", Key: "order-42"}.Derive("settle"),
	} {
		if other == got {
			t.Fatalf("another scope, key or purpose derived the same key %s", got)
		}
	}
	// Wrap's method sees the key too, under the operation's scope.
	var inWrap idem.CallKey
	wrapped := idem.Wrap(s.pool, "orders.create", func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
		inWrap, _ = idem.KeyFromContext(ctx)
		return n, nil
	})
	if _, _, err := wrapped(ctx, "order-42", 1); err != nil {
		t.Fatal(err)
	}
	if want, _ := idem.WrapScope("orders.create", "tenant-1"); inWrap != (idem.CallKey{Scope: want, Key: "order-42"}) {
		t.Fatalf("key inside Wrap: %+v, want scope %q", inWrap, want)
	}
	if _, err := idem.DeriveKey(context.Background(), "charge"); !errors.Is(err, idem.ErrNoKey) {
		t.Fatalf("DeriveKey outside the work: %v, want ErrNoKey", err)
	}
}

// Run reports how each call ended, as a return value, so concurrent calls
// never share a flag (go test -race checks it).
func TestRunReportsOutcomeConcurrently(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var runs atomic.Int64
	release, releaseHolder := holderRelease(t)
	fn := func(ctx context.Context, tx pgx.Tx) (int, error) {
		runs.Add(1)
		select {
		case <-release:
			return 7, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	first := make(chan idem.Outcome, 1)
	go func() {
		_, o, _ := idem.Run(context.Background(), s.pool, "k", "h", fn)
		first <- o
	}()
	waitForLock(t, s)
	// Bounded, so that a broken lock fails the test instead of hanging it.
	bounded, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	outcomes := make([]idem.Outcome, 16)
	for i := range outcomes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, outcomes[i], _ = idem.Run(bounded, s.pool, "k", "h", fn)
		}()
	}
	wg.Wait()
	releaseHolder()
	if o := <-first; o != idem.OutcomeExecuted {
		t.Fatalf("first call: %v", o)
	}
	for i, o := range outcomes {
		if o != idem.OutcomeInProgress {
			t.Fatalf("concurrent call %d: %v, want in_progress", i, o)
		}
	}
	for i := 0; i < 8; i++ {
		v, o, err := idem.Run(context.Background(), s.pool, "k", "h", fn)
		if err != nil || o != idem.OutcomeReplayed || v != 7 {
			t.Fatalf("replay %d: %d, %v, %v", i, v, o, err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("fn ran %d times", runs.Load())
	}
}

// waitForLock waits until some transaction holds a key's advisory lock.
func waitForLock(t *testing.T, s *setup) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if s.count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no key's advisory lock was taken within 10s: does the claim still take it?")
}

type withUnexported struct {
	Amount int64
	secret string
}

type withAny struct {
	Amount any
}

type withSkipped struct {
	Amount int64
	Memo   string `json:"-"`
}

type receiptTimes struct {
	At    time.Time      `json:"at"`
	Tags  []string       `json:"tags,omitempty"`
	Raw   map[string]int `json:"raw,omitempty"`
	Note  *string        `json:"note"`
	Count int64          `json:"count"`
}

// The first call and every replay return equal values; a type that JSON
// cannot carry exactly is refused before fn runs, with a message naming the
// part that would be lost.
func TestReplaysAreExact(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	refused := func(name string, call func() error, part string) {
		t.Helper()
		err := call()
		if !errors.Is(err, idem.ErrInvalidOption) || !strings.Contains(err.Error(), part) {
			t.Errorf("%s: %v; want ErrInvalidOption naming %s", name, err, part)
		}
	}
	ran := false
	refused("unexported field", func() error {
		_, err := idem.Do(ctx, s.pool, "k1", "h", func(pgx.Tx) (withUnexported, error) { ran = true; return withUnexported{1, "x"}, nil })
		return err
	}, "secret")
	refused("interface", func() error {
		_, err := idem.Do(ctx, s.pool, "k2", "h", func(pgx.Tx) (withAny, error) { ran = true; return withAny{int64(7)}, nil })
		return err
	}, "Amount")
	refused("any result", func() error {
		_, err := idem.Do(ctx, s.pool, "k3", "h", func(pgx.Tx) (any, error) { ran = true; return int64(7), nil })
		return err
	}, "interface")
	refused(`json:"-"`, func() error {
		_, err := idem.Do(ctx, s.pool, "k4", "h", func(pgx.Tx) (withSkipped, error) { ran = true; return withSkipped{}, nil })
		return err
	}, "Memo")
	if ran || s.count("SELECT count(*) FROM idempotency_keys") != 0 {
		t.Fatal("a refused type ran fn or stored a key")
	}

	// Values whose JSON form is not their Go form: a time with a monotonic
	// reading and a local zone, an empty slice under omitempty, an empty map.
	note := "n"
	local := time.FixedZone("local", 3*3600)
	fn := func(pgx.Tx) (receiptTimes, error) {
		return receiptTimes{At: time.Now().In(local), Tags: []string{}, Raw: map[string]int{}, Note: &note, Count: 1 << 60}, nil
	}
	first, err := idem.Do(ctx, s.pool, "k5", "h", fn)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		again, err := idem.Do(ctx, s.pool, "k5", "h", fn)
		if err != nil || !reflect.DeepEqual(first, again) {
			t.Fatalf("replay %d differs from the first call:\n first  %#v\n replay %#v (%v)", i, first, again, err)
		}
	}
	if first.Count != 1<<60 {
		t.Fatalf("an int64 beyond 2^53 came back as %d", first.Count)
	}
}

// Every spelling of one table takes the same lock: a duplicate through
// another spelling gets ErrInProgress at once instead of waiting on the row.
func TestLockIgnoresTableSpelling(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	plain, err := idem.NewClient(s.pool, &idem.Config{Table: "idempotency_keys"})
	if err != nil {
		t.Fatal(err)
	}
	qualified, err := idem.NewClient(s.pool, &idem.Config{Table: "public.idempotency_keys"})
	if err != nil {
		t.Fatal(err)
	}
	release, releaseHolder := holderRelease(t)
	done := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), plain, "k", "h", func(pgx.Tx) (int, error) { <-release; return 1, nil })
		done <- err
	}()
	waitForLock(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = idem.Do(ctx, qualified, "k", "h", func(pgx.Tx) (int, error) { return 2, nil })
	releaseHolder()
	if !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("the duplicate through public.idempotency_keys: %v, want ErrInProgress at once (a wait on the row would end at the 5s deadline)", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Errors say what happened and what to do.
func TestErrorsThatHelp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// On a pool or connection with the plain layout (the deferred
	// protocol), the key's row is only written when the call completes: fn
	// finds no row of its key to delete or change, and the key commits with
	// the charge. Everywhere else the claim inserted it, and a call whose
	// row fn removed or completed stores nothing.
	deferred := func(s *setup, v variant) bool { return s.layout.name == "plain" && v.name != "outer_tx" }
	t.Run("fn deletes its own key", func(t *testing.T) {
		forEachVariant(t, func(t *testing.T, s *setup, v variant) {
			_, err := do(t, s, v, "k", "h", func(tx pgx.Tx) (int, error) {
				_, err := tx.Exec(ctx, "DELETE FROM idempotency_keys")
				_, _ = tx.Exec(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 1)")
				return 1, err
			})
			if deferred(s, v) {
				if err != nil || s.charges() != 1 || s.count("SELECT count(*) FROM idempotency_keys WHERE status = 'completed'") != 1 {
					t.Fatalf("%v, %d charges; want the charge and its completed key committed together", err, s.charges())
				}
				return
			}
			if !errors.Is(err, idem.ErrKeyLost) || idem.Retryable(err) {
				t.Fatalf("%v; want ErrKeyLost, not retryable", err)
			}
			if s.charges() != 0 || s.count("SELECT count(*) FROM idempotency_keys") != 0 {
				t.Fatal("the charge or the key committed without the key row")
			}
		})
	})
	t.Run("fn completes its own key", func(t *testing.T) {
		forEachVariant(t, func(t *testing.T, s *setup, v variant) {
			_, err := do(t, s, v, "k", "h", func(tx pgx.Tx) (int, error) {
				_, err := tx.Exec(ctx, "UPDATE idempotency_keys SET status = 'completed', response = '\\x31', completed_at = now()")
				return 1, err
			})
			if deferred(s, v) {
				if err != nil {
					t.Fatalf("%v; want success: fn's update finds no row of its key", err)
				}
				return
			}
			if !errors.Is(err, idem.ErrKeyLost) {
				t.Fatalf("%v; want ErrKeyLost", err)
			}
		})
	})
	t.Run("fn writes its own key's row", func(t *testing.T) {
		forEachVariant(t, func(t *testing.T, s *setup, v variant) {
			if !deferred(s, v) {
				t.Skip("the claim inserted the row already: fn's own insert fails, with fn's error")
			}
			_, err := do(t, s, v, "k", "h", func(tx pgx.Tx) (int, error) {
				_, _ = tx.Exec(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 1)")
				_, err := tx.Exec(ctx, "INSERT INTO idempotency_keys (scope, idempotency_key, request_hash, status, response, completed_at, expires_at) VALUES ('', 'k', 'h', 'completed', '\\x31', now(), now() + interval '1 day')")
				return 1, err
			})
			if !errors.Is(err, idem.ErrKeyLost) || idem.Retryable(err) {
				t.Fatalf("%v; want ErrKeyLost, not retryable", err)
			}
			if s.charges() != 0 || s.count("SELECT count(*) FROM idempotency_keys") != 0 {
				t.Fatal("the charge or fn's key row committed")
			}
		})
	})
	t.Run("no table", func(t *testing.T) {
		s := newSetup(t)
		keys, err := idem.NewClient(s.pool, &idem.Config{Table: "billing_keys"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = idem.Do(ctx, keys, "k", "h", func(pgx.Tx) (int, error) { return 1, nil })
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.UndefinedTable || !strings.Contains(err.Error(), "schema.ApplyTable") {
			t.Fatalf("%v; want the missing table named with how to create it", err)
		}
	})
	t.Run("invalid config", func(t *testing.T) {
		s := newSetup(t)
		for _, c := range []struct {
			cfg  idem.Config
			want error
		}{
			{idem.Config{TTL: -1}, idem.ErrInvalidOption},
			{idem.Config{MaxResultBytes: -1}, idem.ErrInvalidOption},
			{idem.Config{SweepBatchSize: -1}, idem.ErrInvalidOption},
			{idem.Config{IdleTimeout: 1 << 31 * time.Millisecond}, idem.ErrInvalidOption},
			{idem.Config{Table: "Bad"}, idem.ErrInvalidTable},
		} {
			if _, err := idem.NewClient(s.pool, &c.cfg); !errors.Is(err, c.want) {
				t.Fatalf("NewClient(%+v) = %v, want %v", c.cfg, err, c.want)
			}
		}
	})
}

// A key's TTL counts from its completion: a retry right after a call that
// took longer than the TTL replays it instead of running fn again. On both
// protocols of the plain table: the default writes the row at completion,
// REPEATABLE READ inserts it at the claim and completes it (tx.go).
func TestTTLCountsFromCompletion(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string][]idem.Option{
		"deferred": nil,
		"insert":   {idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.RepeatableRead})},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ttlCountsFromCompletion(t, opts)
		})
	}
}

func ttlCountsFromCompletion(t *testing.T, opts []idem.Option) {
	s := newSetup(t)
	const ttl = 5 * time.Second
	keys, err := idem.NewClient(s.pool, &idem.Config{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	slow := func(tx pgx.Tx) (int, error) {
		runs++
		// Longer than the TTL: a lifetime counted from the claim would be
		// over before the key completes.
		_, err := tx.Exec(context.Background(), "SELECT pg_sleep(6)")
		return runs, err
	}
	if _, err := idem.Do(context.Background(), keys, "slow", "h", slow, opts...); err != nil {
		t.Fatal(err)
	}
	_, outcome, err := idem.Run(context.Background(), keys, "slow", "h", func(ctx context.Context, tx pgx.Tx) (int, error) { return slow(tx) }, opts...)
	if err != nil || outcome != idem.OutcomeReplayed || runs != 1 {
		t.Fatalf("retry after a %v call with a %v TTL: %v, %v, fn ran %d times; want a replay", 6*time.Second, ttl, outcome, err, runs)
	}
	rec, err := keys.Lookup(context.Background(), "", "slow")
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.ExpiresAt.Sub(rec.CompletedAt); got != ttl {
		t.Fatalf("ExpiresAt - CompletedAt = %v, want the TTL %v", got, ttl)
	}
	if rec.CompletedAt.Sub(rec.CreatedAt) < 6*time.Second {
		t.Fatalf("completed %v after the claim, want at least the 6s of work", rec.CompletedAt.Sub(rec.CreatedAt))
	}
}

// Wrap's scopes can neither collide with each other nor equal a plain
// scope: one principal can never replay another's stored result.
func TestWrapScopesDoNotCollide(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	secret := func(name string) func(context.Context, pgx.Tx, int) (string, error) {
		return func(context.Context, pgx.Tx, int) (string, error) { return "secret of " + name, nil }
	}
	scoped := func(scope string) context.Context { return idem.ContextWithScope(context.Background(), scope) }
	a, _, err := idem.Wrap(s.pool, "b/charge", secret("a"))(scoped("a"), "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	b, outcome, err := idem.Wrap(s.pool, "charge", secret("a/b"))(scoped("a/b"), "k", 1)
	if err != nil || b == a || outcome != idem.OutcomeExecuted {
		t.Fatalf(`Wrap("charge") in scope "a/b" got %q (%v, %v), the result of Wrap("b/charge") in scope "a" is %q`, b, outcome, err, a)
	}
	unscoped, _, err := idem.Wrap(s.pool, "payments.charge", secret("wrap"))(context.Background(), "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	hash, _ := idem.HashJSON(1) // the hash Wrap gives the request 1: a collision would replay
	plain, err := idem.Do(scoped("payments.charge"), s.pool, "k", hash, func(pgx.Tx) (string, error) { return "secret of a principal", nil })
	if err != nil || plain == unscoped {
		t.Fatalf("a principal named payments.charge got %q (%v); Wrap's result is %q", plain, err, unscoped)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 4 {
		t.Fatalf("%d keys, want 4 unrelated ones", n)
	}
}

// A Client's settings apply to every call made through it, and On runs them
// in an outer transaction.
func TestClientSettings(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	keys, err := idem.NewClient(s.pool, &idem.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := idem.Do(ctx, keys.On(tx), "k", "h", func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys WHERE expires_at - created_at = interval '1 hour'"); n != 1 {
		t.Fatalf("%d keys with the Client's TTL, want 1", n)
	}
}
