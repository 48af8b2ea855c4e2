package integration_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// The promise at the provider: the provider acts once per request, and
// the stored answer says what it did. These tests hold it against a key
// reused after its answer expired or was forgotten, an owner paused while
// another compensates, a pool exhausted under a live owner, and rows
// edited in the database.

// A request that reuses a key after its answer expired, or after Forget,
// is a new run of the operation: its external step sends the processor a
// new derived key, so a processor that still remembers the old key cannot
// answer the new order with the old charge. Within one run every retry
// sends the same key, so the processor charges once per run.
func TestOperationRunsGetTheirOwnDownstreamKeys(t *testing.T) {
	t.Parallel()
	for _, reuse := range []string{"forget", "expiry"} {
		t.Run(reuse, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := newOpSetup(t, nil)
			op := db.operation(nil, nil)
			const key = "order-7"
			req := chargeReq{Amount: 500}
			first, outcome, err := op.Run(ctx, key, req)
			if err != nil || outcome != idem.OutcomeExecuted {
				t.Fatalf("first order: %v, %v", outcome, err)
			}
			switch reuse {
			case "forget":
				if ok, err := db.client.Forget(ctx, "", key); err != nil || !ok {
					t.Fatalf("Forget: %v, %v", ok, err)
				}
			case "expiry":
				db.exec(`UPDATE idempotency_keys SET created_at = created_at - interval '2 days',
					completed_at = completed_at - interval '2 days', expires_at = expires_at - interval '2 days'
					WHERE idempotency_key = $1`, key)
			}
			// The second order's first attempt loses the processor's answer
			// after the charge; its retry continues the same run.
			lossy, answer := db.losingCharge()
			if _, outcome, err := lossy.Run(ctx, key, req); outcome != idem.OutcomeFailed {
				t.Fatalf("second order's first attempt: %v, %v; want failed", outcome, err)
			}
			answer()
			second, outcome, err := lossy.Run(ctx, key, req)
			if err != nil || outcome != idem.OutcomeExecuted {
				t.Fatalf("second order's retry: %v, %v", outcome, err)
			}
			keys := db.proc.seen()
			if len(keys) != 3 || keys[0] == keys[1] || keys[1] != keys[2] {
				t.Fatalf("processor keys %v: want the first order's, then the second's twice", keys)
			}
			if n := db.proc.charged(); n != 2 || first.ChargeID == second.ChargeID {
				t.Fatalf("processor charged %d times; charges %q and %q: want 2 distinct", n, first.ChargeID, second.ChargeID)
			}
			if res, rec := db.rowsOf(key); res != 2 || rec != 2 {
				t.Fatalf("%d reservations, %d receipts; want 2 each (two orders)", res, rec)
			}
		})
	}
}

// exec runs a statement on the test's database.
func (s *opSetup) exec(sql string, args ...any) {
	s.t.Helper()
	if _, err := s.pool.Exec(context.Background(), sql, args...); err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
}

// An owner paused (SIGSTOP) past its lease while the completer (Resume)
// took the operation over past its deadline and compensated calls nothing once it
// wakes: the external step's fence refuses it before the call. Paused
// inside the call (the request already at the processor), it cannot be
// fenced, so Compensate is told the step began and the key it was sent
// with, and voids that key: the charge that arrives afterwards charges
// nothing. Either way the stored answer, "not charged", is true at the
// processor.
func TestOperationPausedOwnerAndCompensation(t *testing.T) {
	t.Parallel()
	db := newOpSetup(t, nil)
	for n, where := range []string{"between_steps", "inside_the_call"} {
		app, key := "idem-comp-"+where, "k-comp-"+where
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			r := rigOn(t, db.pool, db.client, app, sweepLease)
			compensatedOwner(t, r, key, where == "inside_the_call", int64(100+n))
		})
	}
}

func compensatedOwner(t *testing.T, r *opRig, key string, inside bool, amount int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	atProcessor, release := make(chan struct{}), make(chan struct{})
	stop := reserveAfter
	if inside {
		stop = ""
		var once sync.Once
		r.proc.before = func(context.Context, string) error {
			once.Do(func() { close(atProcessor) })
			<-release
			return nil
		}
	}
	a := startOwner(t, ownerConfig{URL: r.proxied, App: r.app, Processor: serveProcessor(t, r.proc),
		Key: key, Amount: amount, Lease: r.lease, Deadline: time.Millisecond, Stop: string(stop)})
	if inside {
		select {
		case <-atProcessor:
		case <-ctx.Done():
			t.Fatal("the owner's call never reached the processor")
		}
	} else {
		a.reach(stop)
	}
	a.signal(syscall.SIGSTOP)
	r.leaseEnded(ctx, key)

	b, compensated := r.voidingCompleter()
	// The completer's path: Resume, from the stored request, again while
	// the paused owner's last renewal may still hold the lease.
	outcome, err := b.Resume(ctx, "", key)
	for outcome == idem.OutcomeInProgress && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		outcome, err = b.Resume(ctx, "", key)
	}
	if outcome != idem.OutcomeRefused || err != nil {
		t.Fatalf("the completer: %v, %v; want the compensation's refusal stored", outcome, err)
	}
	if rec, err := r.client.Lookup(ctx, "", key); err != nil || rec.Refusal == nil || rec.Refusal.Code != "expired" {
		t.Fatalf("stored: %+v, %v; want the refusal %q", rec, err, "expired")
	}
	close(release) // the paused owner's request, if at the processor, goes on
	a.signal(syscall.SIGCONT)
	if !inside {
		a.proceed()
	}
	stale := a.result()
	if stale.Outcome == idem.OutcomeExecuted.String() {
		t.Fatalf("the paused owner, resumed: %+v; want it to fail", stale)
	}

	keys := r.proc.seen()
	told := compensated()
	switch {
	case !inside && (len(keys) != 0 || len(told) != 1 || len(told[0]) != 0):
		t.Fatalf("paused between steps: processor called with %v, Compensate told %v; want no call, nothing to undo", keys, told)
	case !inside && !stale.LeaseLost:
		t.Fatalf("the resumed owner: %+v; want ErrLeaseLost", stale)
	case inside && (len(keys) != 1 || len(told) != 1 || len(told[0]) != 1 ||
		told[0][0] != idem.ExternalCall{Step: "charge", Key: keys[0]}):
		t.Fatalf("paused in the call: processor keys %v, Compensate told %v; want it told of the charge under %v", keys, told, keys)
	}
	if n := r.proc.charged(); n != 0 {
		t.Fatalf("the processor holds %d charges after the answer %q was stored", n, "not charged")
	}
	if _, rec := r.rowsOf(key); rec != 0 || r.unfinished(key) != 0 {
		t.Fatalf("%d receipts, %d unfinished rows; want none", rec, r.unfinished(key))
	}
}

// A live owner keeps its lease while its pool is exhausted: renewals go
// out on a connection of their own, so a replica that polls the whole time
// (two leases) is answered "in progress" and never takes the operation
// over, and the processor call in flight is the one that counts.
func TestOperationLeaseSurvivesASaturatedPool(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := newOpSetup(t, nil)
	// Three seconds: a renewal falls due every second, and a loaded machine
	// must not stall the owner past a lease.
	const lease = 3 * time.Second
	cfg := db.pool.Config()
	cfg.MaxConns = 2
	small, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	atProcessor, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	db.proc.before = func(context.Context, string) error {
		if first.CompareAndSwap(false, true) {
			close(atProcessor)
			<-release
		}
		return nil
	}
	opOn := func(pool *pgxpool.Pool) *idem.Operation[chargeReq, chargeResp] {
		client, err := idem.NewClient(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		op, err := idem.NewOperation(client, "charge", db.chargeSteps(nil), &idem.OperationConfig[chargeReq, chargeResp]{Lease: lease})
		if err != nil {
			t.Fatal(err)
		}
		return op
	}
	owner, replica := opOn(small), opOn(db.pool)
	const key = "k-saturated"
	req := chargeReq{Amount: 700}
	done := make(chan runResult, 1)
	go func() { done <- runOp(ctx, owner, key, req) }()
	<-atProcessor

	// The owner's pool is exhausted for two leases, while the replica
	// keeps asking.
	var held []*pgxpool.Conn
	for range cfg.MaxConns {
		c, err := small.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	answers := map[idem.Outcome]int{}
	var leases []time.Time
	for end := time.Now().Add(2 * lease); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		_, outcome, _ := replica.Run(ctx, key, req)
		answers[outcome]++
		var until time.Time
		if err := db.pool.QueryRow(ctx, "SELECT lease_until FROM idempotency_keys_operations WHERE idempotency_key = $1", key).Scan(&until); err == nil &&
			(len(leases) == 0 || !until.Equal(leases[len(leases)-1])) {
			leases = append(leases, until)
		}
	}
	for _, c := range held {
		c.Release()
	}
	close(release)
	res := <-done
	if res.err != nil || res.outcome != idem.OutcomeExecuted {
		t.Fatalf("the live owner: %v, %v; want executed", res.outcome, res.err)
	}
	if answers[idem.OutcomeInProgress] == 0 || len(answers) != 1 {
		t.Fatalf("the replica's answers while the owner worked: %v; want in progress only", answers)
	}
	if n, calls := db.proc.charged(), db.proc.callCount(); n != 1 || calls != 1 {
		t.Fatalf("processor: %d charges, %d calls; want 1 and 1", n, calls)
	}
	t.Logf("pool of %d held for %v: the replica was answered %v; the lease was renewed %d times", cfg.MaxConns, 2*lease, answers, len(leases)-1)
}

// What decides what runs is bound to the key's request: an unfinished
// operation's row renamed to another operation, or its stored request
// edited, makes Resume answer ErrCorruptRecord before anything runs (by
// the Sealer's authentication when there is one, by the request hash
// otherwise); a sealed step output saved from an earlier run under the key
// and put back into a later run does not open.
func TestOperationRowsBoundToTheRequest(t *testing.T) {
	t.Parallel()
	for _, sealed := range []bool{false, true} {
		name := "plain"
		var cfg *idem.Config
		if sealed {
			name, cfg = "sealed", &idem.Config{Sealer: aeadSealer(t)}
		}
		t.Run(name+"/renamed", func(t *testing.T) {
			t.Parallel()
			db := newOpSetup(t, cfg)
			db.stoppedAtCharge("k-renamed", 300)
			db.exec("UPDATE idempotency_keys_operations SET operation = 'refund'")
			refunds := 0
			refund, err := idem.NewOperation(db.client, "refund", func(*idem.Steps, chargeReq) (chargeResp, error) {
				refunds++
				return chargeResp{}, nil
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := refund.Resume(context.Background(), "", "k-renamed"); !errors.Is(err, idem.ErrCorruptRecord) || refunds != 0 {
				t.Fatalf("Resume of the renamed operation: %v, %d refunds run; want ErrCorruptRecord, none", err, refunds)
			}
		})
		t.Run(name+"/request_edited", func(t *testing.T) {
			t.Parallel()
			db := newOpSetup(t, cfg)
			op, answer := db.stoppedAtCharge("k-edited", 300)
			answer()
			calls := db.proc.callCount()
			if sealed { // another sealed request, stored for another key
				db.stoppedAtCharge("k-other", 99999)
				db.exec(`UPDATE idempotency_keys_operations SET request = (SELECT request FROM idempotency_keys_operations
					WHERE idempotency_key = 'k-other') WHERE idempotency_key = 'k-edited'`)
				calls = db.proc.callCount()
			} else {
				db.exec(`UPDATE idempotency_keys_operations SET request = '{"amount":99999}' WHERE idempotency_key = 'k-edited'`)
			}
			if _, err := op.Resume(context.Background(), "", "k-edited"); !errors.Is(err, idem.ErrCorruptRecord) {
				t.Fatalf("Resume of an edited request: %v; want ErrCorruptRecord", err)
			}
			if now := db.proc.callCount(); now != calls {
				t.Fatalf("the processor was called %d more times", now-calls)
			}
		})
	}
	t.Run("sealed/request_of_an_earlier_run", func(t *testing.T) {
		// Run 1's sealed request and its hash, saved while it was
		// unfinished and put back, after Forget, into run 2: they agree
		// with each other, but were sealed for another run.
		t.Parallel()
		ctx := context.Background()
		db := newOpSetup(t, &idem.Config{Sealer: aeadSealer(t)})
		const key = "k-earlier"
		db.stoppedAtCharge(key, 300)
		var request []byte
		var hash string
		if err := db.pool.QueryRow(ctx, `SELECT o.request, k.request_hash FROM idempotency_keys_operations AS o
			JOIN idempotency_keys AS k USING (scope, idempotency_key)`).Scan(&request, &hash); err != nil {
			t.Fatal(err)
		}
		if ok, err := db.client.Forget(ctx, "", key); err != nil || !ok {
			t.Fatalf("Forget: %v, %v", ok, err)
		}
		op, _ := db.stoppedAtCharge(key, 99999)
		calls := db.proc.callCount()
		db.exec("UPDATE idempotency_keys_operations SET request = $1", request)
		db.exec("UPDATE idempotency_keys SET request_hash = $1", hash)
		if _, err := op.Resume(ctx, "", key); !errors.Is(err, idem.ErrCorruptRecord) {
			t.Fatalf("Resume with run 1's request in run 2: %v; want ErrCorruptRecord", err)
		}
		if now := db.proc.callCount(); now != calls {
			t.Fatalf("the processor was called %d more times", now-calls)
		}
	})
	t.Run("sealed/output_of_an_earlier_run", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		db := newOpSetup(t, &idem.Config{Sealer: aeadSealer(t)})
		const key = "k-runs"
		// Run 1 records its charge and stops before its receipt.
		first := db.operation(map[string]func(context.Context) error{
			"receipt": func(context.Context) error { return errors.New("receipt failed") },
		}, nil)
		if _, outcome, _ := first.Run(ctx, key, chargeReq{Amount: 1}); outcome != idem.OutcomeFailed {
			t.Fatalf("run 1: %v; want failed before its receipt", outcome)
		}
		var saved []byte
		if err := db.pool.QueryRow(ctx, "SELECT output FROM idempotency_keys_steps WHERE step = 'charge'").Scan(&saved); err != nil {
			t.Fatal(err)
		}
		if ok, err := db.client.Forget(ctx, "", key); err != nil || !ok {
			t.Fatalf("Forget: %v, %v", ok, err)
		}
		// Run 2, for another amount, stops at its charge; the saved output
		// is put back as its charge's.
		op, _ := db.stoppedAtCharge(key, 100000)
		db.exec(`INSERT INTO idempotency_keys_steps (scope, idempotency_key, step, output, token, run)
			SELECT scope, idempotency_key, 'charge', $1, token, run FROM idempotency_keys_operations`, saved)
		resp, outcome, err := op.Run(ctx, key, chargeReq{Amount: 100000})
		if !errors.Is(err, idem.ErrCorruptRecord) {
			t.Fatalf("run 2 with run 1's charge put back: %+v, %v, %v; want ErrCorruptRecord", resp, outcome, err)
		}
		if _, rec := db.rowsOf(key); rec != 0 {
			t.Fatalf("%d receipts; want none", rec)
		}
	})
}

// A request that json.Marshal would change (a string that is not valid
// UTF-8 becomes U+FFFD) is refused before anything is stored: otherwise two
// requests differing only there would share a hash and one be answered the
// other's result, and a resumed operation would run U+FFFD.
func TestOperationRefusesARequestItCannotHashExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newOpSetup(t, nil)
	type noteReq struct {
		Note string `json:"note"`
	}
	ran := 0
	op, err := idem.NewOperation(db.client, "note", func(*idem.Steps, noteReq) (chargeResp, error) {
		ran++
		return chargeResp{}, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, outcome, err := op.Run(ctx, "k-note", noteReq{Note: "caf\xe9"})
	if outcome != idem.OutcomeInvalid || !errors.Is(err, idem.ErrInvalidOption) || ran != 0 {
		t.Fatalf("Run: %v, %v, ran %d; want OutcomeInvalid, ErrInvalidOption, not run", outcome, err, ran)
	}
	if _, err := db.client.Lookup(ctx, "", "k-note"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Lookup: %v; want ErrNotFound", err)
	}
}

// An owner that stops on an error releases its lease with the error's
// text, whatever that text holds (a NUL, or a character cut at the length
// stored): a retry right after continues the operation instead of being
// answered "in progress" for the whole lease.
func TestOperationReleaseStoresAnyErrorText(t *testing.T) {
	t.Parallel()
	for name, text := range map[string]string{
		"nul":          "processor said \x00 nothing",
		"cut_in_utf8":  "x" + strings.Repeat("é", 600),
		"invalid_utf8": "bad \xff byte",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := newOpSetup(t, nil)
			var fail atomic.Bool
			fail.Store(true)
			op := db.operation(map[string]func(context.Context) error{
				"charge": func(context.Context) error {
					if fail.Load() {
						return errors.New(text)
					}
					return nil
				},
			}, nil) // the default lease: 30 s
			if _, outcome, _ := op.Run(ctx, "k-text", chargeReq{Amount: 5}); outcome != idem.OutcomeFailed {
				t.Fatalf("first run: %v; want failed", outcome)
			}
			var released bool
			var last string
			if err := db.pool.QueryRow(ctx, "SELECT lease_until <= now(), last_error FROM idempotency_keys_operations").Scan(&released, &last); err != nil || !released {
				t.Fatalf("after the failure: released %v, last_error %q, %v; want the lease ended", released, last, err)
			}
			fail.Store(false)
			if _, outcome, err := op.Run(ctx, "k-text", chargeReq{Amount: 5}); outcome != idem.OutcomeExecuted {
				t.Fatalf("retry: %v, %v; want executed", outcome, err)
			}
		})
	}
}

// Resume, the completer's path, is observed as Run is: a call started and
// ended, with its outcome, so that operations the completer finishes show
// in metrics and traces.
func TestOperationResumeIsObserved(t *testing.T) {
	t.Parallel()
	obs := &countingObserver{}
	db := newOpSetup(t, &idem.Config{Observer: obs})
	op, answer := db.stoppedAtCharge("k-observed", 40)
	answer()
	if outcome, err := op.Resume(context.Background(), "", "k-observed"); err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("Resume: %v, %v", outcome, err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.starts != 2 || obs.ends != 2 {
		t.Fatalf("observed %d starts and %d ends; want Run's and Resume's", obs.starts, obs.ends)
	}
}

// The fence before an external call refuses an owner whose token is no
// longer the operation's, even while its own lease looks valid to it (no
// renewal has told it yet): it calls nothing and stops with ErrLeaseLost.
func TestOperationFenceBeforeTheCall(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newOpRig(t, idem.DefaultLease) // no renewal falls due within the test
	op, reached, release := r.heldAt(reserveAfter)
	done := make(chan runResult, 1)
	go func() { done <- runOp(ctx, op, "k-fence", chargeReq{Amount: 5}) }()
	<-reached
	// Another owner took the operation over: a new token, as operation_take.sql
	// gives one.
	if _, err := r.pool.Exec(ctx, "UPDATE idempotency_keys_operations SET token = token + 1000000 WHERE idempotency_key = 'k-fence'"); err != nil {
		t.Fatal(err)
	}
	close(release)
	res := <-done
	if !errors.Is(res.err, idem.ErrLeaseLost) {
		t.Fatalf("the owner: %v, %v; want ErrLeaseLost", res.outcome, res.err)
	}
	if calls := r.proc.callCount(); calls != 0 {
		t.Fatalf("the processor was called %d times by an owner that had lost the operation", calls)
	}
}

// An external step's record is fenced too: an owner whose call went out
// before another owner took the operation over, and that comes back while
// its own lease still looks valid to it, records nothing and stops with
// ErrLeaseLost; the output the next owner records is the one that counts.
func TestOperationRecordIsFenced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newOpRig(t, idem.DefaultLease) // no renewal falls due within the test
	at, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.proc.after = func(context.Context, string) error {
		once.Do(func() { close(at) })
		<-release
		return nil
	}
	op := r.op(r.pool, nil, noHooks)
	done := make(chan runResult, 1)
	go func() { done <- runOp(ctx, op, "k-record", chargeReq{Amount: 5}) }()
	<-at
	if _, err := r.pool.Exec(ctx, "UPDATE idempotency_keys_operations SET token = token + 1000000 WHERE idempotency_key = 'k-record'"); err != nil {
		t.Fatal(err)
	}
	close(release)
	res := <-done
	if !errors.Is(res.err, idem.ErrLeaseLost) {
		t.Fatalf("the owner: %v, %v; want ErrLeaseLost", res.outcome, res.err)
	}
	for _, s := range r.steps("k-record") {
		if strings.HasPrefix(s, "charge@") {
			t.Fatalf("steps %v: the owner that lost the operation recorded its charge", r.steps("k-record"))
		}
	}
}

// An external step's output is held until the owner's next commit. When
// that commit is the next external step's fence and the owner lost the
// operation meanwhile, the fence refuses it and the held output is not
// recorded either: each record carries the owner's token, whatever the
// transaction it travels in.
func TestOperationHeldOutputIsFenced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newOpRig(t, idem.DefaultLease) // no renewal falls due within the test
	client, err := idem.NewClient(r.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	at, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.proc.after = func(context.Context, string) error {
		once.Do(func() { close(at) })
		<-release
		return nil
	}
	notified := 0
	op, err := idem.NewOperation(client, "charge-and-notify", func(s *idem.Steps, req chargeReq) (chargeResp, error) {
		id, err := idem.External(s, "charge", func(ctx context.Context, key string) (string, error) {
			return r.proc.Charge(ctx, key, req.Amount)
		})
		if err != nil {
			return chargeResp{}, err
		}
		if _, err := idem.External(s, "notify", func(context.Context, string) (int, error) {
			notified++
			return 1, nil
		}); err != nil {
			return chargeResp{}, err
		}
		return chargeResp{ChargeID: id}, nil
	}, &idem.OperationConfig[chargeReq, chargeResp]{Lease: r.lease})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan runResult, 1)
	go func() { done <- runOp(ctx, op, "k-held", chargeReq{Amount: 5}) }()
	<-at
	if _, err := r.pool.Exec(ctx, "UPDATE idempotency_keys_operations SET token = token + 1000000 WHERE idempotency_key = 'k-held'"); err != nil {
		t.Fatal(err)
	}
	close(release)
	res := <-done
	if !errors.Is(res.err, idem.ErrLeaseLost) || notified != 0 {
		t.Fatalf("the owner: %v, %v, notified %d times; want ErrLeaseLost and no notification", res.outcome, res.err, notified)
	}
	if steps := r.steps("k-held"); slices.ContainsFunc(steps, func(s string) bool { return strings.HasPrefix(s, "charge@") }) {
		t.Fatalf("steps %v: the owner that lost the operation recorded its charge", steps)
	}
}

// voidingCompleter is the charge operation as a completer runs it past a
// deadline that has always passed: its Compensate voids, at the processor,
// every external step that began and recorded nothing, by the key it was
// sent, and stores "not charged". compensated returns what each
// Compensate was told.
func (r *opRig) voidingCompleter() (op *idem.Operation[chargeReq, chargeResp], compensated func() [][]idem.ExternalCall) {
	r.t.Helper()
	var (
		mu   sync.Mutex
		told [][]idem.ExternalCall
	)
	op, err := idem.NewOperation(r.client, "charge", boundarySteps(r.proc.Charge, noHooks),
		&idem.OperationConfig[chargeReq, chargeResp]{Lease: r.lease, Deadline: time.Millisecond,
			Compensate: func(s *idem.Steps, _ chargeReq, _ error) (chargeResp, error) {
				calls := s.Unrecorded()
				mu.Lock()
				told = append(told, calls)
				mu.Unlock()
				for _, c := range calls {
					r.proc.Void(c.Key)
				}
				return chargeResp{}, idem.Refuse("expired", "not charged")
			}})
	if err != nil {
		r.t.Fatal(err)
	}
	return op, func() [][]idem.ExternalCall {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(told)
	}
}
