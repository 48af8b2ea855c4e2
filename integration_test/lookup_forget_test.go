package integration_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// Client.Lookup and Client.Forget: what a key holds, and resetting it, on
// each layout and handle, beside a claim, an operation and a lost answer.

// Lookup shows support staff what a key holds; Forget resets it.
func TestLookupAndForget(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	keys, err := idem.NewClient(s.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Lookup(ctx, "", "nope"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Lookup of an unknown key: %v", err)
	}
	tenant := idem.ContextWithScope(ctx, "t1")
	runs := 0
	first, err := idem.Do(tenant, keys, "k", "hash-1", chargeFn(ctx, 5, &runs))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := keys.Lookup(ctx, "t1", "k")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := idem.DecodeResult[charge](rec)
	if err != nil || stored != first || rec.Status != idem.StatusCompleted || rec.RequestHash != "hash-1" || rec.Expired(time.Now()) {
		t.Fatalf("Lookup = %+v, result %+v (%v)", rec, stored, err)
	}
	if _, err := idem.Do(tenant, keys, "r", "h", func(pgx.Tx) (int, error) { return 0, errInsufficientFunds }); !errors.Is(err, errInsufficientFunds) {
		t.Fatal(err)
	}
	if rec, err := keys.Lookup(ctx, "t1", "r"); err != nil || rec.Status != idem.StatusRefused || rec.Refusal == nil || rec.Refusal.Code != "insufficient_funds" {
		t.Fatalf("Lookup of a refusal = %+v, %v", rec, err)
	}

	// A key in progress shows as such, and cannot be forgotten under its
	// holder.
	release, releaseHolder := holderRelease(t)
	done := make(chan error, 1)
	go func() {
		_, err := idem.Do(tenant, keys, "busy", "h", func(pgx.Tx) (int, error) { <-release; return 1, nil })
		done <- err
	}()
	waitForLock(t, s)
	if rec, err := keys.Lookup(ctx, "t1", "busy"); err != nil || rec.Status != idem.StatusInProgress {
		t.Fatalf("Lookup of a key in progress = %+v, %v", rec, err)
	}
	if _, err := keys.Forget(ctx, "t1", "busy"); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Forget of a key in progress: %v", err)
	}
	releaseHolder()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Forget, then the next call runs fn again.
	if ok, err := keys.Forget(ctx, "t1", "k"); !ok || err != nil {
		t.Fatalf("Forget = %v, %v", ok, err)
	}
	if ok, err := keys.Forget(ctx, "t1", "k"); ok || err != nil {
		t.Fatalf("Forget again = %v, %v; want false, nil", ok, err)
	}
	if _, err := idem.Do(tenant, keys, "k", "hash-1", chargeFn(ctx, 5, &runs)); err != nil || runs != 2 {
		t.Fatalf("after Forget: %v, fn ran %d times, want 2", err, runs)
	}
	if s.charges() != 2 {
		t.Fatalf("%d charges, want 2", s.charges())
	}
}

// Lookup takes no lock that outlives its statement, even on a Client bound
// to an outer transaction (Client.On): it reads pg_locks to tell a key in
// progress, so a claim of the key elsewhere is not answered ErrInProgress.
func TestLookupOnOuterTxTakesNoLock(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	keys, err := idem.NewClient(s.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, keys, "k", "h", func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Forget(ctx, "", "k"); err != nil {
		t.Fatal(err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := keys.On(tx).Lookup(ctx, "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Lookup: %v", err)
	}
	_, err = idem.Do(ctx, keys, "k", "h", func(pgx.Tx) (int, error) { return 2, nil })
	if err != nil {
		t.Fatalf("a claim after a Lookup (inside an open transaction elsewhere) of a key nobody holds: %v", err)
	}
}

// TestFaultForgetAnswerLost loses Forget's answer after the server ran it:
// the delete commits on its own at the statement's Sync, so without the
// ReadyForQuery that follows, Forget cannot know whether it committed and
// must say so (ErrOutcomeUnknown), never "failed". Here it did commit.
func TestFaultForgetAnswerLost(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	pool := l.pool(func(c *pgxpool.Config) { c.MaxConns = 1 })
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, keys, "k-forget", ledgerHash, chargeWork(ctx, "k-forget", 1, 5, nil)); err != nil {
		t.Fatal(err)
	}
	// Warms the connection: Forget's statement is prepared, so its trip is
	// then Bind, Execute, Sync, answered up to one ReadyForQuery.
	if _, err := keys.Forget(ctx, "", "k-other"); err != nil {
		t.Fatal(err)
	}
	l.proxy.SetRule(faultproxy.Once(faultproxy.ServerType('Z'), faultproxy.CutBefore))
	_, err = keys.Forget(ctx, "", "k-forget")
	l.proxy.SetRule(nil)
	if !errors.Is(err, idem.ErrOutcomeUnknown) {
		t.Fatalf("Forget with its answer lost: %v; want ErrOutcomeUnknown", err)
	}
	admin, err := idem.NewClient(l.admin, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Lookup(ctx, "", "k-forget"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Lookup after the lost answer: %v; the server committed the delete", err)
	}
}

// Forget leaves a key in progress alone and answers at once, even when the
// key's old row is visible: an expired key that a call is claiming anew.
// With claim.sql (here at REPEATABLE READ) the claim holds the old row's
// lock until it commits, and a Forget that ignored the key's advisory lock
// would wait on it; with the deferred protocol the old row is not locked,
// and the completion replaces whatever is left of it.
func TestForgetLeavesAKeyBeingClaimed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []idem.Option
	}{
		{"deferred", nil},
		{"claim", []idem.Option{idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.RepeatableRead})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
			ctx := context.Background()
			keys, err := idem.NewClient(s.pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := idem.Do(ctx, keys, "k", "h", func(pgx.Tx) (int, error) { return 1, nil }, tc.opts...); err != nil {
				t.Fatal(err)
			}
			if _, err := s.pool.Exec(ctx, "UPDATE idempotency_keys SET created_at = created_at - interval '2 days', expires_at = expires_at - interval '2 days', completed_at = completed_at - interval '2 days'"); err != nil {
				t.Fatal(err)
			}
			release, releaseHolder := holderRelease(t)
			entered := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := idem.Do(ctx, keys, "k", "h", func(pgx.Tx) (int, error) { close(entered); <-release; return 2, nil }, tc.opts...)
				done <- err
			}()
			select {
			case <-entered:
			case err := <-done:
				t.Fatalf("the claim of the expired key: %v", err)
			}
			ok, err := keys.Forget(contended(t), "", "k")
			releaseHolder()
			if !errors.Is(err, idem.ErrInProgress) || ok {
				t.Fatalf("Forget of a key being claimed: %v, %v; want ErrInProgress at once%s", ok, err, waitedForHolder(err))
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got, err := idem.Do(ctx, keys, "k", "h", func(pgx.Tx) (int, error) { return 3, nil }, tc.opts...); err != nil || got != 2 {
				t.Fatalf("after the claim committed: %d, %v; want its result 2 replayed (Forget must not have deleted it)", got, err)
			}
		})
	}
}

// Forget of an operation between its steps (its owner inside its external
// call, no step's transaction open) forgets the key and the operation's
// state together: Stats counts nothing unfinished, and the owner, once its
// call returns, records nothing more (its token matches no row) and stops
// with ErrLeaseLost, without running its next database step.
func TestForgetBetweenStepsStopsTheOwner(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	at, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// The processor has charged; its answer is on its way to the owner.
	s.proc.after = func(context.Context, string) error {
		once.Do(func() { close(at) })
		<-release
		return nil
	}
	op := s.operation(nil, nil)
	done := make(chan runResult, 1)
	go func() { done <- runOp(ctx, op, "k", chargeReq{Amount: 300}) }()
	select {
	case <-at:
	case res := <-done:
		t.Fatalf("the owner ended (%v, %v) before its external call", res.outcome, res.err)
	}

	// A renewal that changes the operation's row while Forget runs makes
	// it answer ErrInProgress: look again, as its godoc says.
	var (
		deleted bool
		err     error
	)
	for {
		deleted, err = s.client.Forget(ctx, "", "k")
		if !errors.Is(err, idem.ErrInProgress) || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || !deleted {
		close(release)
		<-done
		t.Fatalf("Forget between steps: %v, %v; want the key deleted", deleted, err)
	}
	st, err := s.client.Stats(ctx)
	if err != nil || st.Unfinished != 0 {
		close(release)
		<-done
		t.Fatalf("Stats after Forget: %+v, %v; want nothing unfinished", st, err)
	}
	if n := s.unfinished(); n != 0 {
		close(release)
		<-done
		t.Fatalf("%d rows of the forgotten operation left", n)
	}

	close(release)
	res := <-done
	if res.outcome != idem.OutcomeFailed || !errors.Is(res.err, idem.ErrLeaseLost) {
		t.Fatalf("the owner of the forgotten operation: %v, %v; want failed with ErrLeaseLost", res.outcome, res.err)
	}
	if res, rec := s.rowsOf("k"); res != 1 || rec != 0 {
		t.Fatalf("reservations %d, receipts %d; want the step before Forget only", res, rec)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys_steps"); n != 0 {
		t.Fatalf("%d step records after the owner stopped; want none", n)
	}
	if n := s.unfinished(); n != 0 {
		t.Fatalf("%d unfinished rows after the owner stopped", n)
	}
	if rec, err := s.client.Lookup(ctx, "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Lookup after the owner stopped: %+v, %v; want ErrNotFound", rec, err)
	}
}

// Forget while the transaction that begins an operation commits (its key's
// row changed, its operation's row inserted, neither yet visible to
// Forget's snapshot) answers ErrInProgress at once, and the operation keeps
// its key and its state. The transaction below stands in for that one. A
// Forget that waited on the key's row would, once it commits, find the row's
// new version and delete it, and miss the operation's row: the test then
// commits after 10 s (time enough for a loaded machine to start Forget),
// to show it.
func TestForgetLeavesAnOperationBegunUnderIt(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx := context.Background()
	if _, _, err := s.operation(nil, nil).Run(ctx, "k", chargeReq{Amount: 5}); err != nil {
		t.Fatal(err)
	}
	begin, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer begin.Rollback(ctx)
	for _, q := range []string{
		`UPDATE idempotency_keys SET status = 'unfinished', response = NULL, completed_at = NULL WHERE idempotency_key = 'k'`,
		`INSERT INTO idempotency_keys_operations (scope, idempotency_key, operation, request, run, lease_until)
		 VALUES ('', 'k', 'charge', '\x7b7d', gen_random_uuid(), now() + interval '1 minute')`,
	} {
		if _, err := begin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		deleted bool
		err     error
	}
	done := make(chan result, 1)
	go func() {
		deleted, err := s.client.Forget(ctx, "", "k")
		done <- result{deleted, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		if err := begin.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		r = <-done
	}
	if err := begin.Commit(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatal(err)
	}
	if r.deleted || !errors.Is(r.err, idem.ErrInProgress) {
		t.Fatalf("Forget: %v, %v; want ErrInProgress, nothing deleted", r.deleted, r.err)
	}
	if n := s.count(`SELECT count(*) FROM idempotency_keys_operations o WHERE NOT EXISTS
		(SELECT 1 FROM idempotency_keys k WHERE k.scope = o.scope AND k.idempotency_key = o.idempotency_key)`); n != 0 {
		t.Fatalf("%d operation rows without their key", n)
	}
	if n := s.keys("unfinished"); n != 1 {
		t.Fatalf("%d unfinished keys; want the operation's", n)
	}
}

// Forget during an operation's database step answers ErrInProgress at
// once and touches nothing: it neither waits for the step nor deadlocks
// with its last statement, which locks the operation's row, then the
// key's (operation_fence.sql, operation_complete.sql). The transaction below stands in
// for the step, from its fence on.
func TestForgetDuringAStepAnswersAtOnce(t *testing.T) {
	t.Parallel()
	s := newOpSetup(t, nil)
	ctx := context.Background()
	s.stoppedAtCharge("k", 5)
	step, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer step.Rollback(ctx)
	if _, err := step.Exec(ctx, `UPDATE idempotency_keys_operations SET lease_until = now() + interval '1 minute' WHERE idempotency_key = 'k'`); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	deleted, err := s.client.Forget(fctx, "", "k")
	if deleted || !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Forget during a step: %v, %v; want ErrInProgress at once", deleted, err)
	}
	if _, err := step.Exec(ctx, `UPDATE idempotency_keys SET status = 'completed', completed_at = now() WHERE idempotency_key = 'k'`); err != nil {
		t.Fatalf("the step's last statement: %v", err)
	}
	if err := step.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := s.keys("completed"); n != 1 {
		t.Fatalf("%d completed keys; want the step's", n)
	}
}

// TestPartitionedLookupAndForget: an expired row and a live one of the same
// key (a key reused after its TTL, in another partition) read back as the
// live one; Forget removes both.
func TestPartitionedLookupAndForget(t *testing.T) {
	t.Parallel()
	s := newSetupLayout(t, partitioned)
	ctx := context.Background()
	keys, err := idem.NewClient(s.pool, &idem.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, keys, "k", "h1", func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "UPDATE idempotency_keys SET expires_at = created_at - interval '2 hours'"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := idem.Do(ctx, keys, "k", "h2", func(pgx.Tx) (int, error) { return 2, nil }); err != nil {
		t.Fatal(err)
	}
	if n := s.count("SELECT count(DISTINCT tableoid) FROM idempotency_keys WHERE idempotency_key = 'k'"); n != 2 {
		t.Fatalf("the two rows of k are in %d partitions, want 2", n)
	}
	rec, err := keys.Lookup(ctx, "", "k")
	if err != nil || rec.RequestHash != "h2" || rec.Status != idem.StatusCompleted {
		t.Fatalf("Lookup: %+v, %v; want the live row (h2)", rec, err)
	}
	if v, err := idem.DecodeResult[int](rec); err != nil || v != 2 {
		t.Fatalf("Lookup's result %d, %v", v, err)
	}
	if ok, err := keys.Forget(ctx, "", "k"); err != nil || !ok {
		t.Fatalf("Forget: %v, %v", ok, err)
	}
	if n := s.count("SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d rows left after Forget", n)
	}
}
