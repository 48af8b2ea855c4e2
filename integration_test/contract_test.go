package integration_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// Contract 1: the key, fn's writes and the stored result commit together.
func TestOneTransaction(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		runs := 0
		got, err := do(t, s, v, "k-1", "h", chargeFn(ctx, 100, &runs))
		if err != nil {
			t.Fatal(err)
		}
		if s.charges() != 1 || s.keys("completed") != 1 || s.keys("in_progress") != 0 {
			t.Fatalf("charges=%d completed=%d in_progress=%d, want 1 1 0", s.charges(), s.keys("completed"), s.keys("in_progress"))
		}
		var stored []byte
		if err := s.pool.QueryRow(ctx, "SELECT response FROM idempotency_keys WHERE idempotency_key = 'k-1'").Scan(&stored); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`{"id":%d,"amount":100,"balance":%d}`, got.ID, got.Balance)
		if string(stored) != want {
			t.Fatalf("stored %s, want %s", stored, want)
		}
	})
}

// Contract 1 and 5: a COMMIT that fails (a deferred constraint) leaves
// neither the key nor the work, and the error says the outcome is known.
func TestCommitFailureRollsBackKeyAndWork(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		if v.name == "outer_tx" {
			t.Skip("in an outer transaction, COMMIT and its failure belong to the caller")
		}
		ctx := context.Background()
		if _, err := s.pool.Exec(ctx, "INSERT INTO charges (account_id, amount, ref) VALUES (2, 1, 'dup')"); err != nil {
			t.Fatal(err)
		}
		_, err := do(t, s, v, "k-commit", "h", func(tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, "INSERT INTO charges (account_id, amount, ref) VALUES (1, 5, 'dup')")
			return 0, err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.UniqueViolation {
			t.Fatalf("err = %v, want a unique violation at commit", err)
		}
		if errors.Is(err, idem.ErrOutcomeUnknown) {
			t.Fatalf("a COMMIT refused by the server is a known outcome: %v", err)
		}
		if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 0 || s.charges() != 1 {
			t.Fatalf("keys=%d charges=%d, want 0 and the 1 pre-existing", n, s.charges())
		}
	})
}

// Contract 2: a replay returns the stored result without running fn, says
// it is a replay, and writes nothing.
func TestReplay(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		runs := 0
		first, outcome, err := run(ctx, t, s, v, "k-replay", "h", chargeFn(ctx, 250, &runs))
		if err != nil || outcome != idem.OutcomeExecuted {
			t.Fatalf("first call: err=%v outcome=%v, want executed", err, outcome)
		}
		var xmin, xmax string
		rowVersion := func() (string, string) {
			var a, b string
			if err := s.pool.QueryRow(ctx, "SELECT xmin::text, xmax::text FROM idempotency_keys WHERE idempotency_key = 'k-replay'").Scan(&a, &b); err != nil {
				t.Fatal(err)
			}
			return a, b
		}
		xmin, xmax = rowVersion()
		for i := 0; i < 3; i++ {
			got, outcome, err := run(ctx, t, s, v, "k-replay", "h", chargeFn(ctx, 250, &runs))
			if err != nil {
				t.Fatal(err)
			}
			if got != first || outcome != idem.OutcomeReplayed {
				t.Fatalf("replay %d = %+v (%v), want %+v (replayed)", i, got, outcome, first)
			}
		}
		if runs != 1 || s.charges() != 1 {
			t.Fatalf("fn ran %d times, %d charges; want 1 and 1", runs, s.charges())
		}
		if x, y := rowVersion(); x != xmin || y != xmax || y != "0" {
			t.Fatalf("the key row was written or locked by a replay: xmin %s->%s xmax %s->%s", xmin, x, xmax, y)
		}
	})
}

// Contract 3: the same key with another request hash is ErrMismatch and fn
// does not run.
func TestMismatch(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		runs := 0
		if _, err := do(t, s, v, "k-mm", "hash-a", chargeFn(ctx, 1, &runs)); err != nil {
			t.Fatal(err)
		}
		_, err := do(t, s, v, "k-mm", "hash-b", chargeFn(ctx, 999, &runs))
		if !errors.Is(err, idem.ErrMismatch) || idem.Retryable(err) {
			t.Fatalf("err = %v, want ErrMismatch, not retryable", err)
		}
		if runs != 1 || s.charges() != 1 {
			t.Fatalf("fn ran %d times, %d charges; want 1 and 1", runs, s.charges())
		}
	})
}

// Contract 4: a call whose key is held by a running transaction returns
// ErrInProgress at once. The holder waits for the second call to return, so
// a second call that waited for the holder would deadlock (bounded by ctx).
func TestInProgressAnswersAtOnce(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		entered, release := make(chan struct{}), make(chan struct{})
		releaseHolder := sync.OnceFunc(func() { close(release) })
		defer releaseHolder() // on failure too: the holder keeps a connection
		holderErr := make(chan error, 1)
		go func() {
			_, err := idem.Do(ctx, s.pool, "k-busy", "h", func(tx pgx.Tx) (int, error) {
				close(entered)
				<-release
				return 1, nil
			})
			holderErr <- err
		}()
		<-entered
		runs := 0
		v.with(t, s.pool, func(db idem.Beginner) {
			_, err := idem.Do(contended(t), db, "k-busy", "h", chargeFn(ctx, 1, &runs))
			if !errors.Is(err, idem.ErrInProgress) || !idem.Retryable(err) {
				t.Errorf("err = %v, want ErrInProgress (retryable) while the holder runs%s", err, waitedForHolder(err))
			}
		})
		releaseHolder()
		if err := <-holderErr; err != nil {
			t.Fatal(err)
		}
		if runs != 0 {
			t.Fatalf("fn ran %d times under a held key", runs)
		}
	})
}

// Contract 4: 64 goroutines on one key. The first to claim it holds its
// transaction open until the other 63 calls have returned, so each of them
// must have been answered without waiting for it: exactly one execution
// commits, 63 calls get ErrInProgress, and later calls replay the result.
func TestStormOnOneKey(t *testing.T) {
	t.Parallel()
	s := newSetup(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	ctx, cancel := context.WithTimeout(context.Background(), stormBound)
	defer cancel()
	const n = 64
	var (
		mu       sync.Mutex
		runs     int
		results  []charge
		inFlight int
		returned = make(chan struct{}, n)
	)
	fn := func(tx pgx.Tx) (charge, error) {
		mu.Lock()
		runs++
		mu.Unlock()
		var c charge
		err := tx.QueryRow(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 7) RETURNING id, amount").Scan(&c.ID, &c.Amount)
		for i := 0; i < n-1 && err == nil; i++ {
			select {
			case <-returned:
			case <-ctx.Done():
				err = fmt.Errorf("only %d other calls returned while the key was held: %w", i, ctx.Err())
			}
		}
		return c, err
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, err := idem.Do(ctx, s.pool, "k-storm", "h", fn)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				results = append(results, c)
			case errors.Is(err, idem.ErrInProgress):
				inFlight++
				returned <- struct{}{}
			default:
				t.Errorf("unexpected error: %v%s", err, waitedForHolder(err))
			}
		}()
	}
	close(start)
	wg.Wait()
	if s.charges() != 1 || runs != 1 || len(results) != 1 || inFlight != n-1 {
		t.Fatalf("charges=%d runs=%d results=%d in_progress=%d; want 1 1 1 %d", s.charges(), runs, len(results), inFlight, n-1)
	}
	for i := 0; i < 8; i++ {
		c, err := idem.Do(ctx, s.pool, "k-storm", "h", fn)
		if err != nil || c != results[0] {
			t.Fatalf("replay %d: %+v, %v; want %+v", i, c, err, results[0])
		}
	}
}

// Contract 4, opt-in: with WithWait every caller of a stormed key gets the
// first result instead of ErrInProgress.
func TestStormWithWait(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]charge, 32)
	errs := make([]error, 32)
	runs := 0
	var mu sync.Mutex
	fn := func(tx pgx.Tx) (charge, error) {
		mu.Lock()
		runs++
		mu.Unlock()
		var c charge
		err := tx.QueryRow(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 3) RETURNING id, amount").Scan(&c.ID, &c.Amount)
		return c, err
	}
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = idem.Do(ctx, s.pool, "k-wait", "h", fn, idem.WithWait(time.Minute))
		}()
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil || results[i] != results[0] {
			t.Fatalf("call %d: %+v, %v; want %+v, nil", i, results[i], errs[i], results[0])
		}
	}
	if s.charges() != 1 || runs != 1 {
		t.Fatalf("charges=%d runs=%d, want 1 and 1", s.charges(), runs)
	}
}

// Many keys over many goroutines, each key sent twice: one charge per key.
func TestManyKeysManyGoroutines(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	const workers, perWorker = 16, 40
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				key := fmt.Sprintf("k-%d-%d", w, i)
				var first charge
				for attempt := 0; attempt < 2; attempt++ {
					runs := 0
					c, err := idem.Do(ctx, s.pool, key, "h", chargeFn(ctx, 1, &runs))
					if err != nil {
						t.Errorf("%s: %v", key, err)
						return
					}
					if attempt == 0 {
						first = c
					} else if c != first || runs != 0 {
						t.Errorf("%s: replay %+v (runs %d), want %+v (0)", key, c, runs, first)
					}
				}
			}
		}()
	}
	wg.Wait()
	if got := s.charges(); got != workers*perWorker {
		t.Fatalf("%d charges, want %d", got, workers*perWorker)
	}
	if got := s.count("SELECT balance FROM accounts WHERE id = 1"); got != 1000000-workers*perWorker {
		t.Fatalf("balance %d, want %d", got, 1000000-workers*perWorker)
	}
}

var errDeclinedByBank = errors.New("bank said no")

type gatewayError struct{ Code int }

func (e *gatewayError) Error() string { return fmt.Sprintf("gateway %d", e.Code) }

// Contract 5: a technical failure stores nothing, comes back intact, and the
// retry runs fn afresh.
func TestFailuresAreNotStored(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		assertClean := func(what string) {
			t.Helper()
			if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 0 || s.charges() != 0 {
				t.Fatalf("%s: keys=%d charges=%d, want 0 0", what, n, s.charges())
			}
		}
		t.Run("error", func(t *testing.T) {
			wrapped := fmt.Errorf("charge: %w", &gatewayError{Code: 502})
			_, err := do(t, s, v, "k-err", "h", func(tx pgx.Tx) (int, error) {
				if _, err := tx.Exec(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 1)"); err != nil {
					return 0, err
				}
				return 0, errors.Join(wrapped, errDeclinedByBank)
			})
			var ge *gatewayError
			if !errors.As(err, &ge) || ge.Code != 502 || !errors.Is(err, errDeclinedByBank) {
				t.Fatalf("fn's error did not come back intact: %v", err)
			}
			assertClean("after fn error")
		})
		t.Run("panic", func(t *testing.T) {
			func() {
				defer func() {
					if r := recover(); r != "boom" {
						t.Fatalf("recovered %v, want the original panic", r)
					}
				}()
				_, _ = do(t, s, v, "k-err", "h", func(tx pgx.Tx) (int, error) {
					if _, err := tx.Exec(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 1)"); err != nil {
						return 0, err
					}
					panic("boom")
				})
			}()
			assertClean("after panic")
		})
		t.Run("context cancelled in fn", func(t *testing.T) {
			cctx, cancel := context.WithCancel(ctx)
			v.with(t, s.pool, func(db idem.Beginner) {
				_, err := idem.Do(cctx, db, "k-err", "h", func(tx pgx.Tx) (int, error) {
					if _, err := tx.Exec(cctx, "INSERT INTO charges (account_id, amount) VALUES (1, 1)"); err != nil {
						return 0, err
					}
					cancel()
					_, err := tx.Exec(cctx, "SELECT 1")
					return 0, err
				})
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("err = %v, want context.Canceled", err)
				}
			})
			assertClean("after cancellation")
		})
		t.Run("result type that cannot be stored", func(t *testing.T) {
			ran := false
			_, err := do(t, s, v, "k-err", "h", func(tx pgx.Tx) (func(), error) {
				ran = true
				return func() {}, nil
			})
			if !errors.Is(err, idem.ErrInvalidOption) || ran {
				t.Fatalf("err = %v, fn ran: %v; want ErrInvalidOption before fn runs", err, ran)
			}
			assertClean("after refusing the type")
		})
		t.Run("unencodable result", func(t *testing.T) {
			type reading struct{ Value float64 }
			_, err := do(t, s, v, "k-err", "h", func(tx pgx.Tx) (reading, error) {
				_, err := tx.Exec(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 1)")
				return reading{Value: math.NaN()}, err
			})
			if err == nil || !strings.Contains(err.Error(), "encode result") {
				t.Fatalf("err = %v, want an encoding error", err)
			}
			assertClean("after encoding failure")
		})
		t.Run("retry runs afresh", func(t *testing.T) {
			runs := 0
			if _, err := do(t, s, v, "k-err", "h", chargeFn(ctx, 5, &runs)); err != nil {
				t.Fatal(err)
			}
			if runs != 1 || s.charges() != 1 {
				t.Fatalf("runs=%d charges=%d, want 1 1", runs, s.charges())
			}
		})
	})
}

var errInsufficientFunds = idem.Refuse("insufficient_funds", "the balance does not cover the amount").WithStatus(402)

// Contract 6: a refusal rolls back fn's writes, commits the key with the
// refusal, and every replay returns an equal refusal and the same value.
func TestRefusalIsStoredAndReplayed(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		runs := 0
		fn := func(tx pgx.Tx) (charge, error) {
			runs++
			if _, err := tx.Exec(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 10)"); err != nil {
				return charge{}, err
			}
			return charge{Amount: 10, Balance: 3}, fmt.Errorf("charge: %w", errInsufficientFunds)
		}
		for i := 0; i < 3; i++ {
			got, outcome, err := run(ctx, t, s, v, "k-refuse", "h", fn)
			var r *idem.Refusal
			if !errors.Is(err, errInsufficientFunds) || !errors.As(err, &r) || r.Status != 402 || r.Message != errInsufficientFunds.Message {
				t.Fatalf("call %d: err = %v, want the refusal", i, err)
			}
			want := idem.OutcomeRefused
			if i > 0 {
				want = idem.OutcomeReplayed
			}
			if got != (charge{Amount: 10, Balance: 3}) || outcome != want || idem.Retryable(err) {
				t.Fatalf("call %d: %+v outcome=%v retryable=%v, want outcome %v", i, got, outcome, idem.Retryable(err), want)
			}
		}
		if runs != 1 || s.charges() != 0 || s.keys("refused") != 1 {
			t.Fatalf("runs=%d charges=%d refused keys=%d, want 1 0 1", runs, s.charges(), s.keys("refused"))
		}
	})
}

// countingBeginner fails the test if Do touches the database.
type countingBeginner struct{ t *testing.T }

func (b countingBeginner) Begin(context.Context) (pgx.Tx, error) {
	b.t.Fatal("Do began a transaction for invalid input")
	return nil, nil
}

// Contract 7: invalid input is refused before any database work: a call's
// key, hash and scope by the call, a deployment's table and TTL by
// NewClient.
func TestInvalidInputBeforeDatabase(t *testing.T) {
	t.Parallel()
	fn := func(pgx.Tx) (int, error) { t.Fatal("fn ran"); return 0, nil }
	long := strings.Repeat("k", 256)
	cases := []struct {
		name, scope, key, hash string
		want                   error
	}{
		{"empty key", "", "", "h", idem.ErrInvalidKey},
		{"256-byte key", "", long, "h", idem.ErrInvalidKey},
		{"NUL", "", "a\x00b", "h", idem.ErrInvalidKey},
		{"newline", "", "a\nb", "h", idem.ErrInvalidKey},
		{"DEL", "", "a\x7fb", "h", idem.ErrInvalidKey},
		{"C1 control", "", "a\u0085b", "h", idem.ErrInvalidKey},
		{"invalid UTF-8", "", "a\xffb", "h", idem.ErrInvalidKey},
		{"empty hash", "", "k", "", idem.ErrInvalidRequestHash},
		{"scope NUL", "t\x00", "k", "h", idem.ErrInvalidScope},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := idem.ContextWithScope(context.Background(), c.scope)
			_, err := idem.Do(ctx, countingBeginner{t}, c.key, c.hash, fn)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
		})
	}
	configs := []struct {
		name string
		cfg  idem.Config
		want error
	}{
		{"table", idem.Config{Table: "keys; drop table x"}, idem.ErrInvalidTable},
		{"ttl", idem.Config{TTL: -time.Second}, idem.ErrInvalidOption},
	}
	// A pool that could not connect (pgxpool connects lazily): NewClient
	// checks its Config without touching the database.
	nowhere, err := pgxpool.New(context.Background(), "postgres://idem@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer nowhere.Close()
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			if _, err := idem.NewClient(nowhere, &c.cfg); !errors.Is(err, c.want) {
				t.Fatalf("NewClient: %v, want %v", err, c.want)
			}
		})
	}
}

// Contract 8: an expired key counts as absent; the next call runs fn and
// replaces the row in place.
func TestExpiry(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		runs := 0
		s.cfg = &idem.Config{TTL: 90 * time.Minute}
		first, err := do(t, s, v, "k-exp", "h1", chargeFn(ctx, 1, &runs))
		if err != nil {
			t.Fatal(err)
		}
		if ttl := s.count("SELECT extract(epoch FROM expires_at - created_at)::int FROM idempotency_keys"); ttl != 90*60 {
			t.Fatalf("expires_at - created_at = %ds, want %d", ttl, 90*60)
		}
		if _, err := s.pool.Exec(ctx, "UPDATE idempotency_keys SET expires_at = now() - interval '1 second'"); err != nil {
			t.Fatal(err)
		}
		// Even another request hash is accepted: the old key is gone. (A
		// Client with the defaults: the pool itself, given bare, is refused
		// now that a Client with settings was made on it.)
		s.cfg = &idem.Config{}
		second, err := do(t, s, v, "k-exp", "h2", chargeFn(ctx, 2, &runs))
		if err != nil {
			t.Fatal(err)
		}
		if runs != 2 || second == first || s.charges() != 2 {
			t.Fatalf("runs=%d charges=%d second=%+v, want fn to run again", runs, s.charges(), second)
		}
		if n := s.count("SELECT count(*) FROM idempotency_keys WHERE request_hash = 'h2' AND expires_at > now() + interval '23 hours'"); n != 1 {
			t.Fatalf("the row was not replaced with the default TTL (%d rows)", n)
		}
	})
}

// Contract 9: the same key in two scopes is two keys.
func TestScopes(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		asAlice := idem.ContextWithScope(ctx, "user:alice")
		runs := 0
		alice, outcome, err := run(asAlice, t, s, v, "shared-key", "h", chargeFn(ctx, 11, &runs))
		if err != nil || outcome != idem.OutcomeExecuted {
			t.Fatalf("alice: %v, %v", outcome, err)
		}
		bob, outcome, err := run(idem.ContextWithScope(ctx, "user:bob"), t, s, v, "shared-key", "h", chargeFn(ctx, 22, &runs))
		if err != nil || outcome != idem.OutcomeExecuted {
			t.Fatalf("bob, the same key in another scope: %v, %v; want executed", outcome, err)
		}
		again, outcome, err := run(asAlice, t, s, v, "shared-key", "h", chargeFn(ctx, 33, &runs))
		if err != nil || outcome != idem.OutcomeReplayed {
			t.Fatalf("alice again: %v, %v; want replayed", outcome, err)
		}
		if runs != 2 || bob.Amount != 22 || again != alice {
			t.Fatalf("runs=%d alice=%+v bob=%+v again=%+v", runs, alice, bob, again)
		}
		if n := s.count("SELECT count(DISTINCT scope) FROM idempotency_keys WHERE idempotency_key = 'shared-key'"); n != 2 {
			t.Fatalf("%d scopes stored for the key, want 2", n)
		}
	})
}

// Contract 10: a result of several MiB round-trips intact.
// A result over Config.MaxResultBytes is refused and leaves nothing; a
// larger limit stores and replays it.
func TestLargeResult(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		big := strings.Repeat("0123456789abcdef", 6<<20/16) + "end"
		fn := func(tx pgx.Tx) (string, error) {
			_, err := tx.Exec(context.Background(), "INSERT INTO charges (account_id, amount) VALUES (1, 1)")
			return big, err
		}
		if _, err := do(t, s, v, "k-big", "h", fn); !errors.Is(err, idem.ErrResultTooLarge) || idem.Retryable(err) {
			t.Fatalf("6 MiB result under the default limit: %v, want ErrResultTooLarge, not retryable", err)
		}
		if s.charges() != 0 || s.count("SELECT count(*) FROM idempotency_keys") != 0 {
			t.Fatal("a result over the limit left a trace")
		}
		s.cfg = &idem.Config{MaxResultBytes: 8 << 20}
		if _, err := do(t, s, v, "k-big", "h", fn); err != nil {
			t.Fatal(err)
		}
		got, outcome, err := run(context.Background(), t, s, v, "k-big", "h", fn)
		if err != nil || outcome != idem.OutcomeReplayed || sha256.Sum256([]byte(got)) != sha256.Sum256([]byte(big)) {
			t.Fatalf("replay of %d bytes: got %d bytes, %v, err=%v; want replayed", len(big), len(got), outcome, err)
		}
	})
}

// fn must not end Do's transaction; nested savepoints work inside it.
func TestTransactionHandedToFn(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		_, err := do(t, s, v, "k-tx", "h", func(tx pgx.Tx) (int, error) {
			if err := tx.Commit(ctx); !errors.Is(err, idem.ErrTxOwned) {
				return 0, fmt.Errorf("Commit: %w, want ErrTxOwned", err)
			}
			if err := tx.Rollback(ctx); !errors.Is(err, idem.ErrTxOwned) {
				return 0, fmt.Errorf("Rollback: %w, want ErrTxOwned", err)
			}
			inner, err := tx.Begin(ctx)
			if err != nil {
				return 0, err
			}
			if _, err := inner.Exec(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 1)"); err != nil {
				return 0, err
			}
			if err := inner.Rollback(ctx); err != nil {
				return 0, err
			}
			kept, err := tx.Begin(ctx)
			if err != nil {
				return 0, err
			}
			if _, err := kept.Exec(ctx, "INSERT INTO charges (account_id, amount) VALUES (1, 2)"); err != nil {
				return 0, err
			}
			return 0, kept.Commit(ctx)
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := s.count("SELECT count(*) FROM charges WHERE amount = 2"); n != 1 || s.charges() != 1 {
			t.Fatalf("savepoints: %d charges, want only the committed one", s.charges())
		}
	})
}

// xorSealer stands in for encryption: it makes the stored bytes differ.
type xorSealer struct{ failOpen bool }

func (xorSealer) Seal(_ context.Context, _, _ string, b []byte) ([]byte, error) {
	out := make([]byte, len(b))
	for i := range b {
		out[i] = b[i] ^ 0x5a
	}
	return out, nil
}

func (x xorSealer) Open(ctx context.Context, scope, key string, b []byte) ([]byte, error) {
	if x.failOpen {
		return nil, errors.New("key rotated away")
	}
	return x.Seal(ctx, scope, key, b)
}

func TestSealer(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	fn := func(pgx.Tx) (string, error) { return "card 4242", nil }
	sealed, err := idem.NewClient(s.pool, &idem.Config{Sealer: xorSealer{}})
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := idem.NewClient(s.pool, &idem.Config{Sealer: xorSealer{failOpen: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, sealed, "k-seal", "h", fn); err != nil {
		t.Fatal(err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys WHERE position('4242' in encode(response, 'escape')) > 0"); n != 0 {
		t.Fatal("the plain result was stored")
	}
	got, err := idem.Do(ctx, sealed, "k-seal", "h", fn)
	if err != nil || got != "card 4242" {
		t.Fatalf("replay = %q, %v", got, err)
	}
	_, err = idem.Do(ctx, rotated, "k-seal", "h", fn)
	if !errors.Is(err, idem.ErrCorruptRecord) {
		t.Fatalf("err = %v, want ErrCorruptRecord", err)
	}
}

// The fast path's own transaction type supports large objects too.
func TestLargeObjectsInFn(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		ctx := context.Background()
		oid, err := do(t, s, v, "k-lo", "h", func(tx pgx.Tx) (uint32, error) {
			los := tx.LargeObjects()
			oid, err := los.Create(ctx, 0)
			if err != nil {
				return 0, err
			}
			obj, err := los.Open(ctx, oid, pgx.LargeObjectModeWrite)
			if err != nil {
				return 0, err
			}
			_, err = obj.Write([]byte("receipt"))
			return oid, err
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := s.count("SELECT count(*) FROM pg_largeobject_metadata WHERE oid = $1", oid); n != 1 {
			t.Fatal("the large object did not commit with the key")
		}
	})
}

// A custom table, created with schema.ApplyTable, works end to end.
func TestCustomTable(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, "CREATE SCHEMA billing"); err != nil {
		t.Fatal(err)
	}
	if err := applyTable(ctx, s.pool, "billing.idem_keys"); err != nil {
		t.Fatal(err)
	}
	keys, err := idem.NewClient(s.pool, &idem.Config{Table: "billing.idem_keys"})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	for i := 0; i < 2; i++ {
		if _, err := idem.Do(ctx, keys, "k", "h", chargeFn(ctx, 1, &runs)); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 1 || s.count("SELECT count(*) FROM billing.idem_keys") != 1 || s.count("SELECT count(*) FROM idempotency_keys") != 0 {
		t.Fatal("the custom table was not used")
	}
}

// The pool variant needs a *pgxpool.Pool; make sure the test pools are that.
var _ idem.Beginner = (*pgxpool.Pool)(nil)

// An outer transaction holding an uncommitted key makes other callers see
// ErrInProgress until it commits, and then replay.
func TestOuterTransactionHoldsKeyUntilCommit(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // on failure: the pool closes only once the connection is back
	runs := 0
	first, err := idem.Do(ctx, tx, "k-outer", "h", chargeFn(ctx, 4, &runs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(contended(t), s.pool, "k-outer", "h", chargeFn(ctx, 4, &runs)); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("err = %v, want ErrInProgress while the outer transaction is open%s", err, waitedForHolder(err))
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := idem.Do(ctx, s.pool, "k-outer", "h", chargeFn(ctx, 4, &runs))
	if err != nil || got != first || runs != 1 {
		t.Fatalf("after commit: %+v, %v, runs=%d", got, err, runs)
	}
}
