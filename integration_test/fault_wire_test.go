package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
)

// A wireFault loses part of one Do call on the wire.
type wireFault struct {
	name string
	rule func() faultproxy.Rule
	// committed: the server committed the call's work before the client
	// lost the connection.
	committed bool
	// onConnOnly: the point exists only in the pipelined protocol Do runs
	// on a pool or a connection.
	onConnOnly bool
	// confirmed: COMMIT's reply reached the client before the connection
	// failed, so the call succeeded, whatever came after the reply.
	confirmed bool
}

func rule(match faultproxy.Match, a faultproxy.Action) func() faultproxy.Rule {
	return func() faultproxy.Rule { return faultproxy.Once(match, a) }
}

func cut(match faultproxy.Match) func() faultproxy.Rule {
	return func() faultproxy.Rule { return faultproxy.Once(match, faultproxy.CutBefore) }
}

var wireFaults = []wireFault{
	// (a) The claim never reaches the server.
	{name: "a_before_claim", rule: cut(faultproxy.ClientSQLContains("idempotency_keys"))},
	// (a) The claim runs in the implicit transaction; BEGIN never arrives.
	{name: "a_before_begin", rule: cut(faultproxy.ClientSQL("begin")), onConnOnly: true},
	// (b) Claim, BEGIN and SAVEPOINT ran; their answer is lost.
	{name: "b_claim_answer_lost", rule: cut(faultproxy.ServerTag("SAVEPOINT")), onConnOnly: true},
	// (b) The key is claimed; fn's first statement never arrives.
	{name: "b_after_claim", rule: cut(faultproxy.ClientSQL("insert into charges"))},
	// (c) fn inserted the charge; the balance update never arrives.
	{name: "c_mid_fn", rule: cut(faultproxy.ClientSQL("update accounts"))},
	// (c) fn's insert ran; its answer is lost.
	{name: "c_mid_fn_answer_lost", rule: cut(faultproxy.ServerTag("INSERT 0 1"))},
	// (d) COMMIT was sent but never reached the server.
	{name: "d_commit_lost", rule: cut(faultproxy.ClientSQL("commit"))},
	// (d) COMMIT reached the server and committed; its answer is lost.
	{name: "d_commit_answer_lost", rule: cut(faultproxy.ServerTag("COMMIT")), committed: true},
	// (d) COMMIT committed and the session was terminated (FATAL 57P01)
	// instead of its reply.
	{name: "d_commit_answered_by_fatal", rule: rule(faultproxy.ServerTag("COMMIT"), faultproxy.FatalBefore), committed: true},
	// (e) COMMIT's reply arrived, then a FATAL before the pipeline's
	// ReadyForQuery: the call succeeded.
	{name: "e_commit_confirmed_then_fatal", rule: rule(faultproxy.ServerTag("COMMIT"), faultproxy.FatalAfter), committed: true, confirmed: true},
	// (e) COMMIT's reply arrived, then the connection was reset.
	{name: "e_commit_confirmed_then_reset", rule: rule(faultproxy.ServerTag("COMMIT"), faultproxy.CutAfter), committed: true, confirmed: true},
}

// TestFaultWire cuts one Do call at each point of wireFaults, over a pool,
// a connection or an outer transaction in turn (each point over one of
// them; TestFaultWireLong runs each over all three), then retries the key
// through a healthy connection until it succeeds.
func TestFaultWire(t *testing.T) { faultWire(t, false) }

// TestFaultWireLong is TestFaultWire with each point over a pool, a
// connection and an outer transaction.
func TestFaultWireLong(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("every fault point over every handle: make test-long runs it (IDEM_TEST_LONG=1)")
	}
	faultWire(t, true)
}

func faultWire(t *testing.T, all bool) {
	paths := []string{"pool", "conn", "outer_tx"}
	for _, path := range paths {
		for i, f := range wireFaults {
			if f.onConnOnly && path == "outer_tx" {
				continue
			}
			// One path per point: the next in turn, or the pool for a
			// point an outer transaction cannot have.
			turn := paths[i%len(paths)]
			if f.onConnOnly && turn == "outer_tx" {
				turn = "pool"
			}
			if !all && path != turn {
				continue
			}
			t.Run(path+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				runWireFault(t, newLedger(t), path, f)
			})
		}
	}
}

func runWireFault(t *testing.T, l *ledger, path string, f wireFault) {
	ctx := context.Background()
	const key, account, amount = "k-fault", 1, 100
	work := chargeWork(ctx, key, account, amount, nil)
	warm := chargeWork(ctx, "k-warm", 0, 1, nil)

	var (
		first           receipt
		doErr, outerErr error
		retryDB         idem.Beginner
	)
	switch path {
	case "pool", "outer_tx":
		// One connection, warmed by a first call, so the statements are
		// prepared and the faulty call sends only Bind and Execute.
		pool := l.pool(func(c *pgxpool.Config) { c.MaxConns = 1 })
		if _, err := idem.Do(ctx, pool, "k-warm", ledgerHash, warm); err != nil {
			t.Fatal(err)
		}
		retryDB = pool
		if path == "pool" {
			l.proxy.SetRule(f.rule())
			first, doErr = idem.Do(ctx, pool, key, ledgerHash, work)
			break
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.proxy.SetRule(f.rule())
		first, doErr = idem.Do(ctx, tx, key, ledgerHash, work)
		if doErr == nil {
			outerErr = idem.Commit(ctx, tx)
		} else {
			_ = tx.Rollback(ctx)
		}
	case "conn":
		conn := l.conn()
		if _, err := idem.Do(ctx, conn, "k-warm", ledgerHash, warm); err != nil {
			t.Fatal(err)
		}
		l.proxy.SetRule(f.rule())
		first, doErr = idem.Do(ctx, conn, key, ledgerHash, work)
		retryDB = l.admin
	}
	l.proxy.SetRule(nil)
	if l.proxy.Cuts() != 1 {
		t.Fatalf("the fault fired %d times, want 1", l.proxy.Cuts())
	}

	switch {
	case path != "outer_tx" && f.confirmed:
		if doErr != nil {
			t.Fatalf("Do: %v; COMMIT's reply confirmed the commit, so the call succeeded", doErr)
		}
	case path != "outer_tx" && strings.HasPrefix(f.name, "d_"):
		unknown(t, doErr)
	case path == "outer_tx" && (strings.HasPrefix(f.name, "d_") || f.confirmed):
		// COMMIT is the caller's: Do succeeded and idem.Commit failed
		// without knowing whether it committed (pgx's Commit cannot show
		// a confirmed COMMIT apart from the FATAL after it).
		if doErr != nil {
			t.Fatalf("Do: %v; want it to succeed, COMMIT being the caller's", doErr)
		}
		unknown(t, outerErr)
	default:
		definite(t, doErr)
		if !idem.Retryable(doErr) {
			t.Fatalf("%v: a lost connection must be retryable", doErr)
		}
	}
	if f.committed {
		if keyRow, charges := l.committed(key); !keyRow || charges != 1 {
			t.Fatalf("key row %v, %d charges; the COMMIT reached the server", keyRow, charges)
		}
	} else {
		l.noTrace(key)
	}

	again, calls, replayed := retryKey(t, retryDB, key, work)
	if replayed != f.committed {
		t.Fatalf("retry replayed %v, want %v", replayed, f.committed)
	}
	answers := []receipt{again}
	if f.committed && doErr == nil {
		// A call that failed returns no result, even if its COMMIT landed.
		answers = append(answers, first)
	}
	l.exactlyOnce(key, account, amount, answers...)
	t.Logf("first call: %v; outer commit: %v; settled after %d calls, replayed %v", doErr, outerErr, calls, replayed)
}

// TestFaultReplayRead cuts a replay: the claim's answer, which carries the
// stored result, is lost on its way to the client.
func TestFaultReplayRead(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	pool := l.pool()
	work := chargeWork(ctx, "k-replay", 1, 100, nil)
	first, err := idem.Do(ctx, pool, "k-replay", ledgerHash, work)
	if err != nil {
		t.Fatal(err)
	}
	l.proxy.SetRule(faultproxy.Once(func(m faultproxy.Message) bool {
		return !m.FromClient && m.Type == 'D' && strings.Contains(m.SQL, "idempotency_keys")
	}, faultproxy.CutBefore))
	_, err = idem.Do(ctx, pool, "k-replay", ledgerHash, work)
	l.proxy.SetRule(nil)
	definite(t, err)
	again, calls, replayed := retryKey(t, pool, "k-replay", work)
	if !replayed {
		t.Fatal("the retry ran fn again")
	}
	l.exactlyOnce("k-replay", 1, 100, first, again)
	t.Logf("replay cut: %v; settled after %d calls", err, calls)
}

// recorded is the messages of one call, as the proxy saw them.
type recorded struct{ client, server []faultproxy.Message }

// recorder returns a rule that appends every message to r.
func (r *recorded) recorder() faultproxy.Rule {
	return func(m faultproxy.Message) faultproxy.Action {
		m.Body = nil
		if m.FromClient {
			r.client = append(r.client, m)
		} else {
			r.server = append(r.server, m)
		}
		return faultproxy.Pass
	}
}

// lastRoundTrip returns the 1-based position of the first message of the
// round trip that carries COMMIT, among the client's and the server's
// messages, or 0 if there is none.
func (r recorded) lastRoundTrip() (client, server int) {
	isCommit := faultproxy.ClientSQL("commit")
	for i, m := range r.client {
		if isCommit(m) {
			client = 1
			for j := i - 1; j >= 0; j-- {
				if t := r.client[j].Type; t == 'S' || t == 'Q' { // the end of the previous round trip
					client = j + 2
					break
				}
			}
			break
		}
	}
	for i, m := range r.server {
		if m.Type == 'C' && m.Tag == "COMMIT" {
			server = 1
			for j := i - 1; j >= 0; j-- {
				if r.server[j].Type == 'Z' {
					server = j + 2
					break
				}
			}
			break
		}
	}
	return client, server
}

// commitReply returns the 1-based position of COMMIT's CommandComplete among
// the server's messages, or 0 if there is none.
func (r recorded) commitReply() int {
	for i, m := range r.server {
		if m.Type == 'C' && m.Tag == "COMMIT" {
			return i + 1
		}
	}
	return 0
}

// sweepCall is one Do call swept by TestFaultSweep: it runs the call through
// the proxy on a new connection and reports Do's error and, for an outer
// transaction, the caller's Commit error.
type sweepCall func(t *testing.T, l *ledger, key string, account int64, armed func()) (first receipt, doErr, outerErr error)

// TestFaultSweep cuts one Do call before each of its messages in turn, in
// both directions, and checks after every cut that the error tells the
// truth and that a retry settles the key exactly once. This covers every
// point between the claim and the answer of COMMIT, and every round trip.
func TestFaultSweep(t *testing.T) {
	onConn := func(t *testing.T, l *ledger, key string, account int64, armed func()) (receipt, error, error) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, l.proxied)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := idem.Do(ctx, conn, "w-"+key, ledgerHash, chargeWork(ctx, "w-"+key, 0, 1, nil)); err != nil {
			t.Fatal(err)
		}
		armed()
		r, err := idem.Do(ctx, conn, key, ledgerHash, chargeWork(ctx, key, account, 100, nil))
		l.proxy.SetRule(nil) // before Close sends Terminate
		return r, err, nil
	}
	onOuterTx := func(t *testing.T, l *ledger, key string, account int64, armed func()) (receipt, error, error) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, l.proxied)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := idem.Do(ctx, conn, "w-"+key, ledgerHash, chargeWork(ctx, "w-"+key, 0, 1, nil)); err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		armed()
		defer l.proxy.SetRule(nil) // before Close sends Terminate
		r, doErr := idem.Do(ctx, tx, key, ledgerHash, chargeWork(ctx, key, account, 100, nil))
		if doErr != nil {
			_ = tx.Rollback(ctx)
			return r, doErr, nil
		}
		return r, nil, tx.Commit(ctx)
	}
	for _, c := range []struct {
		name string
		call sweepCall
	}{{"conn", onConn}, {"outer_tx", onOuterTx}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sweep(t, newLedger(t), c.name == "outer_tx", c.call)
		})
	}
	t.Run("replay", func(t *testing.T) {
		t.Parallel()
		sweepReplay(t, newLedger(t))
	})
}

func sweep(t *testing.T, l *ledger, outer bool, call sweepCall) {
	account := int64(1)
	var calib recorded
	_, err, outerErr := call(t, l, "k-calibrate", account, func() { l.proxy.SetRule(calib.recorder()) })
	l.proxy.SetRule(nil)
	if err != nil || outerErr != nil {
		t.Fatal(err, outerErr)
	}
	lastClient, lastServer := calib.lastRoundTrip()
	if lastClient == 0 || lastServer == 0 {
		t.Fatalf("no COMMIT in the calibration call: %v %v", calib.client, calib.server)
	}

	faults, replays, calls := 0, 0, 0
	for _, dir := range []struct {
		name  string
		n     int
		last  int
		match func(int) faultproxy.Match
	}{
		{"client", len(calib.client), lastClient, func(i int) faultproxy.Match { return faultproxy.Nth(i, faultproxy.FromClient) }},
		{"server", len(calib.server), lastServer, func(i int) faultproxy.Match { return faultproxy.Nth(i, faultproxy.FromServer) }},
	} {
		for i := 1; i <= dir.n; i++ {
			account++
			key := fmt.Sprintf("k-%s-%d", dir.name, i)
			var at []faultproxy.Message
			if dir.name == "client" {
				at = calib.client
			} else {
				at = calib.server
			}
			first, doErr, outerErr := call(t, l, key, account, func() {
				l.proxy.SetRule(faultproxy.Once(dir.match(i), faultproxy.CutBefore))
			})
			l.proxy.SetRule(nil)
			faults++
			where := fmt.Sprintf("cut before %s message %d/%d (%v)", dir.name, i, dir.n, at[i-1])

			afterCommitSent := i >= dir.last
			// A cut after COMMIT's reply reached the client: COMMIT's own
			// reply decides, and it confirmed the commit.
			confirmed := dir.name == "server" && i > calib.commitReply()
			switch {
			case outer && doErr != nil:
				// Do never commits an outer transaction, so it never
				// answers ErrOutcomeUnknown.
				if errors.Is(doErr, idem.ErrOutcomeUnknown) {
					t.Fatalf("%s: %v", where, doErr)
				}
			case outer:
				if outerErr == nil {
					t.Fatalf("%s: the call and its outer commit both succeeded", where)
				}
			case confirmed:
				if doErr != nil {
					t.Fatalf("%s: got %v; COMMIT's reply confirmed the commit, so the call succeeded", where, doErr)
				}
			case afterCommitSent:
				if !errors.Is(doErr, idem.ErrOutcomeUnknown) {
					t.Fatalf("%s: got %v, want ErrOutcomeUnknown", where, doErr)
				}
			default:
				if doErr == nil || errors.Is(doErr, idem.ErrOutcomeUnknown) {
					t.Fatalf("%s: got %v, want a definite failure", where, doErr)
				}
			}
			if doErr != nil && !idem.Retryable(doErr) {
				t.Fatalf("%s: %v is not retryable", where, doErr)
			}
			// Before the round trip of COMMIT the server cannot commit;
			// once the server answers that round trip, it has.
			mustCommit := dir.name == "server" && afterCommitSent
			if !afterCommitSent {
				l.noTrace(key)
			}
			again, n, replayed := retryKey(t, l.admin, key, chargeWork(context.Background(), key, account, 100, nil))
			calls += n
			if !afterCommitSent && replayed {
				t.Fatalf("%s: the retry replayed a call that cannot have committed", where)
			}
			if mustCommit && !replayed {
				t.Fatalf("%s: the retry ran fn again after the server committed", where)
			}
			answers := []receipt{again}
			if replayed {
				replays++
				if doErr == nil {
					answers = append(answers, first)
				}
			}
			l.exactlyOnce(key, account, 100, answers...)
		}
	}
	t.Logf("outer %v: %d messages client, %d server; %d faults, %d retry calls, %d retries replayed, %d keyed charges committed",
		outer, len(calib.client), len(calib.server), faults, calls, replays, faults+1)
}

func sweepReplay(t *testing.T, l *ledger) {
	ctx := context.Background()
	const key, account = "k-stored", 1
	work := chargeWork(ctx, key, account, 100, nil)
	stored, err := idem.Do(ctx, l.admin, key, ledgerHash, work)
	if err != nil {
		t.Fatal(err)
	}
	replay := func(armed func()) (receipt, error) {
		conn, err := pgx.Connect(ctx, l.proxied)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := idem.Do(ctx, conn, "w", ledgerHash, chargeWork(ctx, "w", 0, 1, nil)); err != nil {
			t.Fatal(err)
		}
		armed()
		defer l.proxy.SetRule(nil) // before Close sends Terminate
		return idem.Do(ctx, conn, key, ledgerHash, work)
	}
	var calib recorded
	if _, err := replay(func() { l.proxy.SetRule(calib.recorder()) }); err != nil {
		t.Fatal(err)
	}
	l.proxy.SetRule(nil)

	faults, answered := 0, 0
	for _, dir := range []struct {
		n     int
		match func(int) faultproxy.Match
	}{
		{len(calib.client), func(i int) faultproxy.Match { return faultproxy.Nth(i, faultproxy.FromClient) }},
		{len(calib.server), func(i int) faultproxy.Match { return faultproxy.Nth(i, faultproxy.FromServer) }},
	} {
		for i := 1; i <= dir.n; i++ {
			got, err := replay(func() { l.proxy.SetRule(faultproxy.Once(dir.match(i), faultproxy.CutBefore)) })
			l.proxy.SetRule(nil)
			faults++
			answers := []receipt{stored}
			if err == nil {
				// The stored result arrived whole before the cut, and
				// the replay needs nothing after it.
				answered++
				answers = append(answers, got)
			} else {
				definite(t, err)
			}
			again, _, replayed := retryKey(t, l.admin, key, work)
			if !replayed {
				t.Fatalf("cut %d: the retry ran fn again", i)
			}
			l.exactlyOnce(key, account, 100, append(answers, again)...)
		}
	}
	t.Logf("replay: %d messages client, %d server; %d faults, %d answered from what arrived before the cut, 1 charge committed",
		len(calib.client), len(calib.server), faults, answered)
}
