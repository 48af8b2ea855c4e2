package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/pgurl"
)

// The failover test (-failover): clients run idem.Do against a primary that
// streams its WAL asynchronously to a standby. At 30% of the operations
// the standby falls behind (-cut stream: it stops receiving WAL; -cut
// pause: it stops replaying it), at 60% the primary crashes and the standby
// is promoted. The clients wait, and the promoted node is checked before
// anyone writes to it: every key row has its business rows and every
// business row its key row. The clients then go on against the promoted
// node, retrying what failed with the same key, and at the end every key
// the old primary had acknowledged is sent once more: a key the promoted
// node holds must replay the answer the client was given, a key it lost
// must run again, once.

// failoverPlan is the shape of a failover run.
type failoverPlan struct {
	standbyURL  string // the standby's server URL
	primaryStop string // shell command that crashes the primary
	cut         string // "stream" or "pause"
	// waldump and standbyWAL (pg_waldump and the standby's pg_wal), when
	// set, count the transactions the standby's WAL holds only part of.
	waldump, standbyWAL string
}

// foResult is one operation of the failover run.
type foResult struct {
	class    string
	key      string
	entry    entry
	outcome  idem.Outcome
	err      string
	attempts int
	promoted bool // answered by the promoted node (else by the old primary)
}

// foTarget is the database the clients use; during the failover its gate is
// closed, and callers that fail wait on it.
type foTarget struct {
	mu       sync.Mutex
	pool     *pgxpool.Pool
	promoted bool          // pool is the promoted node's
	gate     chan struct{} // closed while pool is usable
	// onOld counts calls under way on the old primary: the promoted node is
	// checked once none is left, so that no answer from the old primary
	// arrives after the check has counted them.
	onOld atomic.Int64
}

// current returns the pool to call on and whether it is the promoted
// node's; a call on the old primary is counted until the caller ends it.
func (t *foTarget) current() (*pgxpool.Pool, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.promoted {
		t.onOld.Add(1)
	}
	return t.pool, t.promoted
}

// foChecked is what the promoted node held before any client wrote to it.
type foChecked struct {
	keyRows, ledgerRows     int
	keysWithoutLedger       int // key rows whose ledger row is missing
	ledgerWithoutKey        int // ledger rows whose key row is missing
	inProgress              int
	balancesWrong           int
	acknowledged            int // keys the old primary had answered before it crashed
	acknowledgedPresent     int
	acknowledgedLost        int
	unacknowledgedPresent   int // committed on the old primary, answer lost in the crash
	answersDiffer           int // acknowledged and present, but another row than the client was told
	cutLSN, receivedLSN     string
	replayedLSN, primaryLSN string
	tailBytes               int64 // WAL the primary wrote after the standby's last received byte
	startLSN                string
	walCommitted, walCut    int // transactions whose commit record the standby received; those it has records of but no end
}

// runFailover is the parent of a failover run. It returns the exit status.
func runFailover(p plan, fp failoverPlan, keep bool) int {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout+time.Minute)
	defer cancel()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "idem-load -failover:", err)
		return 1
	}
	if fp.standbyURL == "" || fp.primaryStop == "" || (fp.cut != "stream" && fp.cut != "pause") {
		return fail(errors.New("needs -standby-url, -primary-stop and -cut stream|pause"))
	}
	serverURL, adminURL := serverURLs()
	name := fmt.Sprintf("idem_failover_%d", os.Getpid())
	primaryURL, _, err := createDatabase(ctx, adminURL, serverURL, name, crashSQL)
	if err != nil {
		return fail(err)
	}
	standbyURL := pgurl.WithDatabase(fp.standbyURL, name)
	if !keep {
		// The primary is gone by then: drop the database on the promoted node.
		defer func() {
			if err := dropOn(fp.standbyURL, name); err != nil {
				fmt.Fprintln(os.Stderr, "idem-load -failover: drop:", err)
			}
		}()
	}
	standby, err := pgx.Connect(ctx, standbyURL)
	for deadline := time.Now().Add(time.Minute); err != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		standby, err = pgx.Connect(ctx, standbyURL)
	}
	if err != nil {
		return fail(fmt.Errorf("the standby never showed the database: %w", err))
	}
	defer standby.Close(ctx)
	var startLSN string
	if err := standby.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn()::text").Scan(&startLSN); err != nil {
		return fail(err)
	}
	pool, err := pgxpool.New(ctx, primaryURL)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	t := &foTarget{pool: pool, gate: make(chan struct{})}
	close(t.gate)
	fmt.Printf("idem-load -failover: %d clients, %d operations, standby falls behind by %s at 30%%, primary crashes at 60%%, database %s\n",
		p.clients, p.ops, fp.cut, name)

	var answered atomic.Int64
	results := make([][]foResult, p.clients)
	clientsDone := make(chan struct{})
	var (
		chk      *foChecked
		chaosErr error
		chaosWG  sync.WaitGroup
		wg       sync.WaitGroup
	)
	clientCtx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	chaosWG.Go(func() {
		chk, chaosErr = failOver(ctx, fp, t, standby, standbyURL, primaryURL, startLSN, &answered, p.ops, results, clientsDone)
		if chaosErr != nil {
			stopClients() // they may be waiting at a gate that will not open
		}
	})
	for c := range p.clients {
		wg.Go(func() { runFailoverClient(clientCtx, t, p, c, results, &answered) })
	}
	wg.Wait()
	close(clientsDone)
	chaosWG.Wait()
	if chaosErr != nil {
		return fail(chaosErr)
	}
	t.mu.Lock()
	newPool := t.pool
	t.mu.Unlock()
	if newPool != pool {
		defer newPool.Close()
	}
	fig := reconcileFailover(ctx, fp, newPool, results, chk)
	fig.print(os.Stdout)
	if len(fig.violations) > 0 {
		return 1
	}
	return 0
}

// failOver makes the standby fall behind, crashes the primary, promotes the
// standby and checks it, at their points of progress.
func failOver(ctx context.Context, fp failoverPlan, t *foTarget, standby *pgx.Conn, standbyURL, primaryURL, startLSN string,
	answered *atomic.Int64, total int, results [][]foResult, clientsDone <-chan struct{},
) (*foChecked, error) {
	wait := func(pct int) bool {
		for answered.Load() < int64(total*pct/100) {
			select {
			case <-clientsDone:
				return false
			case <-time.After(10 * time.Millisecond):
			}
		}
		return true
	}
	chk := &foChecked{startLSN: startLSN}
	if !wait(30) {
		return nil, errors.New("the clients finished before the standby was cut")
	}
	if err := cutStandby(ctx, fp.cut, standby); err != nil {
		return nil, err
	}
	if err := standby.QueryRow(ctx, "SELECT coalesce(pg_last_wal_receive_lsn()::text, '')").Scan(&chk.cutLSN); err != nil {
		return nil, err
	}
	if !wait(60) {
		return nil, errors.New("the clients finished before the primary crashed")
	}

	// Close the gate first, so that failing clients wait instead of
	// spinning, then crash the primary.
	t.mu.Lock()
	gate := make(chan struct{})
	t.gate = gate
	t.mu.Unlock()
	if primary, err := pgx.Connect(ctx, primaryURL); err == nil {
		_ = primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&chk.primaryLSN)
		primary.Close(ctx)
	}
	if err := shell(ctx, fp.primaryStop); err != nil {
		return nil, fmt.Errorf("crash the primary: %w", err)
	}
	if err := standby.QueryRow(ctx,
		"SELECT coalesce(pg_last_wal_receive_lsn()::text, ''), coalesce(pg_last_wal_replay_lsn()::text, '')").
		Scan(&chk.receivedLSN, &chk.replayedLSN); err != nil {
		return nil, err
	}
	if fp.waldump != "" {
		var err error
		if chk.walCommitted, chk.walCut, err = cutTransactions(ctx, fp, startLSN, chk.receivedLSN); err != nil {
			return nil, err
		}
	}
	if err := promote(ctx, standby); err != nil {
		return nil, err
	}
	if chk.primaryLSN != "" && chk.receivedLSN != "" {
		_ = standby.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint", chk.primaryLSN, chk.receivedLSN).Scan(&chk.tailBytes)
	}
	// Which keys had the old primary acknowledged? Every call under way on
	// it has ended (its answer arrived before the crash, or its error after)
	// once none is counted; the clients then wait at the gate.
	for deadline := time.Now().Add(time.Minute); t.onOld.Load() > 0; {
		if time.Now().After(deadline) {
			return nil, errors.New("calls on the crashed primary did not end within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := checkPromoted(ctx, standby, chk, acknowledged(t, results)); err != nil {
		return nil, err
	}
	newPool, err := pgxpool.New(ctx, standbyURL)
	if err != nil {
		return nil, err
	}
	// The old pool stays open until the run ends: a client that took it
	// just before the swap gets a connection error, and retries.
	t.mu.Lock()
	t.pool, t.promoted = newPool, true
	t.mu.Unlock()
	close(gate)
	return chk, nil
}

// acknowledged returns the answer the old primary gave each key. The
// clients append to their results as they go, so it reads them under the
// target's lock, which the clients take to publish each answer.
func acknowledged(t *foTarget, results [][]foResult) map[string]entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	acked := map[string]entry{}
	for _, rs := range results {
		for _, r := range rs {
			if r.err == "" && !r.promoted {
				acked[r.key] = r.entry
			}
		}
	}
	return acked
}

// walRecord matches a record of pg_waldump's output: its resource manager,
// transaction id and description; subxacts, the subtransactions a commit
// or abort record ends with its transaction (fn's writes are in the
// savepoint's).
var (
	walRecord = regexp.MustCompile(`^rmgr: (\S+)\s.*\btx:\s+(\d+),.*\bdesc: (\S+)`)
	subxacts  = regexp.MustCompile(`subxacts: ([\d ]+)`)
)

// cutTransactions reads the WAL the standby received during the run (from
// start to end) with pg_waldump, and counts the transactions whose commit
// record is in it, and those of which it holds records but neither a commit
// nor an abort: transactions the cut went through the middle of, which the
// promoted node must show none of.
func cutTransactions(ctx context.Context, fp failoverPlan, start, end string) (committed, cut int, err error) {
	cmd := exec.CommandContext(ctx, fp.waldump, "-p", fp.standbyWAL, "-t", "1", "-s", start, "-e", end)
	out, runErr := cmd.Output()
	seen, ended := map[string]bool{}, map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		m := walRecord.FindStringSubmatch(line)
		if m == nil || m[2] == "0" {
			continue
		}
		seen[m[2]] = true
		if m[1] == "Transaction" && (strings.HasPrefix(m[3], "COMMIT") || strings.HasPrefix(m[3], "ABORT")) {
			ended[m[2]] = true
			if sub := subxacts.FindStringSubmatch(line); sub != nil {
				for _, x := range strings.Fields(sub[1]) {
					ended[x] = true
				}
			}
			if strings.HasPrefix(m[3], "COMMIT") {
				committed++
			}
		}
	}
	if len(seen) == 0 {
		return 0, 0, fmt.Errorf("pg_waldump found no transactions between %s and %s: %w", start, end, runErr)
	}
	for xid := range seen {
		if !ended[xid] {
			cut++
		}
	}
	return committed, cut, nil
}

// promote promotes the standby and waits until it accepts writes. It does
// not wait inside pg_promote: a statement waiting on a standby holds a
// snapshot, and replaying the rest of the WAL (which promotion does first)
// can cancel it as a recovery conflict after max_standby_streaming_delay.
func promote(ctx context.Context, standby *pgx.Conn) error {
	var ok bool
	if err := standby.QueryRow(ctx, "SELECT pg_promote(false)").Scan(&ok); err != nil {
		return fmt.Errorf("promote the standby: %w", err)
	}
	if !ok {
		return errors.New("promote the standby: pg_promote answered false")
	}
	for deadline := time.Now().Add(5 * time.Minute); ; {
		var recovering bool
		if err := standby.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering); err != nil {
			return fmt.Errorf("promote the standby: %w", err)
		}
		if !recovering {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the standby was not promoted within 5 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cutStandby makes the standby fall behind: it stops receiving WAL
// (primary_conninfo emptied and reloaded; the WAL receiver exits), or stops
// replaying what it receives.
func cutStandby(ctx context.Context, how string, standby *pgx.Conn) error {
	var query string
	if how == "stream" {
		for _, sql := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
			if _, err := standby.Exec(ctx, sql); err != nil {
				return fmt.Errorf("%s: %w", sql, err)
			}
		}
		query = "SELECT count(*) = 0 FROM pg_stat_wal_receiver"
	} else {
		if _, err := standby.Exec(ctx, "SELECT pg_wal_replay_pause()"); err != nil {
			return err
		}
		query = "SELECT pg_get_wal_replay_pause_state() = 'paused'"
	}
	for deadline := time.Now().Add(time.Minute); ; {
		var done bool
		if err := standby.QueryRow(ctx, query).Scan(&done); err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby did not fall behind within a minute (%s)", query)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkPromoted reads the promoted node before anyone writes to it: key rows
// against ledger rows, balances against the ledger, and which acknowledged
// keys survived.
func checkPromoted(ctx context.Context, db *pgx.Conn, chk *foChecked, acked map[string]entry) error {
	err := db.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM idempotency_keys),
		       (SELECT count(*) FROM ledger),
		       (SELECT count(*) FROM idempotency_keys k WHERE NOT EXISTS (SELECT 1 FROM ledger l WHERE l.idem_key = k.idempotency_key)),
		       (SELECT count(*) FROM ledger l WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.idempotency_key = l.idem_key)),
		       (SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'),
		       (SELECT count(*) FROM accounts a WHERE a.balance <> coalesce((SELECT sum(amount) FROM ledger l WHERE l.account = a.id), 0))`).
		Scan(&chk.keyRows, &chk.ledgerRows, &chk.keysWithoutLedger, &chk.ledgerWithoutKey, &chk.inProgress, &chk.balancesWrong)
	if err != nil {
		return fmt.Errorf("check the promoted node: %w", err)
	}
	present := map[string]entry{}
	rows, _ := db.Query(ctx, "SELECT idem_key, id, amount FROM ledger")
	var (
		key string
		e   entry
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &e.ID, &e.Amount}, func() error {
		present[key] = e
		return nil
	}); err != nil {
		return err
	}
	chk.acknowledged = len(acked)
	for key, told := range acked {
		if got, ok := present[key]; ok {
			chk.acknowledgedPresent++
			if got != told {
				chk.answersDiffer++
			}
		} else {
			chk.acknowledgedLost++
		}
	}
	for key := range present {
		if _, ok := acked[key]; !ok {
			chk.unacknowledgedPresent++
		}
	}
	return nil
}

// runFailoverClient sends client c's operations, each until answered, and
// appends each answer to results[c]; while the database fails over it waits
// at the gate.
func runFailoverClient(ctx context.Context, t *foTarget, p plan, c int, results [][]foResult, answered *atomic.Int64) {
	rng := p.clientRand(0, c)
	n := p.clientCalls(0, c)
	var used []string
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		class, key := classFresh, p.freshKey(0, c, i)
		if len(used) > 0 && rng.Float64() < p.retryProb() {
			class, key = classRetry, used[rng.IntN(len(used))]
		} else {
			used = append(used, key)
		}
		r := callUntilAnswered(ctx, t, class, key)
		// Published under the target's lock: the failover reads the
		// answers given before the crash while the clients run.
		t.mu.Lock()
		results[c] = append(results[c], r)
		t.mu.Unlock()
		answered.Add(1)
	}
}

// callUntilAnswered runs one operation with idem.Run until it is answered.
func callUntilAnswered(ctx context.Context, t *foTarget, class, key string) foResult {
	r := foResult{class: class, key: key}
	hash, err := idem.HashJSON(opRequest{Account: accountOf(key), Amount: amountOf(key)})
	if err != nil {
		r.err = err.Error()
		return r
	}
	for {
		t.mu.Lock()
		gate := t.gate
		t.mu.Unlock()
		select {
		case <-gate:
		case <-ctx.Done():
			r.err = ctx.Err().Error()
			return r
		}
		r.attempts++
		db, promoted := t.current()
		r.entry, r.outcome, err = idem.Run(ctx, db, key, hash, func(ctx context.Context, tx pgx.Tx) (entry, error) {
			e := entry{Amount: amountOf(key)}
			if err := tx.QueryRow(ctx, "INSERT INTO ledger (idem_key, account, amount) VALUES ($1, $2, $3) RETURNING id",
				key, accountOf(key), e.Amount).Scan(&e.ID); err != nil {
				return e, err
			}
			_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + $2 WHERE id = $1", accountOf(key), e.Amount)
			return e, err
		}, idem.WithWait(time.Minute))
		if !promoted {
			t.onOld.Add(-1)
		}
		if err == nil {
			r.promoted = promoted
			return r
		}
		if ctx.Err() != nil || !idem.Retryable(err) {
			r.err = err.Error()
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// foFigures is the outcome of a failover run.
type foFigures struct {
	fp                     failoverPlan
	chk                    foChecked
	ops, answered          int
	beforeCrash            int
	resentReplayed         int // acknowledged keys sent again after the run: replayed
	resentExecuted         int // ... ran again (the promoted node had lost them)
	finalKeys, finalLedger int
	violations             []string
}

func (f *foFigures) violate(format string, args ...any) {
	if len(f.violations) < 20 {
		f.violations = append(f.violations, fmt.Sprintf(format, args...))
	}
}

// reconcileFailover checks the promoted node's state as read before the
// clients wrote to it, sends every key the old primary acknowledged once
// more, and checks the final state: one ledger row and one completed key row
// per key, balances exact.
func reconcileFailover(ctx context.Context, fp failoverPlan, pool *pgxpool.Pool, results [][]foResult, chk *foChecked) *foFigures {
	fig := &foFigures{fp: fp, chk: *chk}
	if chk.keysWithoutLedger != 0 || chk.ledgerWithoutKey != 0 {
		fig.violate("promoted node: %d key rows without their ledger row, %d ledger rows without their key row", chk.keysWithoutLedger, chk.ledgerWithoutKey)
	}
	if chk.inProgress != 0 || chk.balancesWrong != 0 {
		fig.violate("promoted node: %d keys in progress, %d balances that differ from the ledger", chk.inProgress, chk.balancesWrong)
	}
	if chk.answersDiffer != 0 {
		fig.violate("promoted node: %d acknowledged keys hold another row than their answer", chk.answersDiffer)
	}
	if fp.cut == "stream" && chk.acknowledgedLost == 0 {
		fig.violate("the standby lost no acknowledged key: the run did not exercise a lost tail")
	}
	acked := map[string]entry{}
	last := map[string]entry{}
	for _, rs := range results {
		for _, r := range rs {
			fig.ops++
			if r.err != "" {
				fig.violate("key %s: never answered: %s", r.key, r.err)
				continue
			}
			fig.answered++
			if !r.promoted {
				fig.beforeCrash++
				acked[r.key] = r.entry
			} else {
				last[r.key] = r.entry
			}
		}
	}
	// A client that was told about a key before the failover asks again.
	for key, told := range acked {
		hash, _ := idem.HashJSON(opRequest{Account: accountOf(key), Amount: amountOf(key)})
		got, outcome, err := idem.Run(ctx, pool, key, hash, func(ctx context.Context, tx pgx.Tx) (entry, error) {
			e := entry{Amount: amountOf(key)}
			if err := tx.QueryRow(ctx, "INSERT INTO ledger (idem_key, account, amount) VALUES ($1, $2, $3) RETURNING id",
				key, accountOf(key), e.Amount).Scan(&e.ID); err != nil {
				return e, err
			}
			_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + $2 WHERE id = $1", accountOf(key), e.Amount)
			return e, err
		})
		switch {
		case err != nil:
			fig.violate("key %s: resent after the failover: %v", key, err)
		case outcome == idem.OutcomeReplayed:
			fig.resentReplayed++
			if _, later := last[key]; !later && got != told {
				fig.violate("key %s: replayed %+v after the failover, the client was told %+v", key, got, told)
			}
		default:
			fig.resentExecuted++
		}
		last[key] = got
	}
	if fig.resentExecuted > chk.acknowledgedLost {
		fig.violate("%d acknowledged keys ran again after the failover, only %d were lost", fig.resentExecuted, chk.acknowledgedLost)
	}

	ledger := map[string][]entry{}
	rows, _ := pool.Query(ctx, "SELECT idem_key, id, amount FROM ledger")
	var (
		key string
		e   entry
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &e.ID, &e.Amount}, func() error {
		ledger[key] = append(ledger[key], e)
		fig.finalLedger++
		return nil
	}); err != nil {
		fig.violate("read the ledger: %v", err)
	}
	for key, es := range ledger {
		if len(es) != 1 {
			fig.violate("key %s committed %d times", key, len(es))
		}
		if l, ok := last[key]; ok && l != es[0] {
			fig.violate("key %s: last answered %+v, the ledger holds %+v", key, l, es[0])
		}
	}
	for key := range last {
		if len(ledger[key]) == 0 {
			fig.violate("key %s: answered, no ledger row", key)
		}
	}
	var inProgress, wrongBalances, keysWithoutLedger int
	if err := pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM idempotency_keys),
		       (SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'),
		       (SELECT count(*) FROM accounts a WHERE a.balance <> coalesce((SELECT sum(amount) FROM ledger l WHERE l.account = a.id), 0)),
		       (SELECT count(*) FROM idempotency_keys k WHERE NOT EXISTS (SELECT 1 FROM ledger l WHERE l.idem_key = k.idempotency_key))`).
		Scan(&fig.finalKeys, &inProgress, &wrongBalances, &keysWithoutLedger); err != nil {
		fig.violate("final check: %v", err)
	}
	if inProgress != 0 || wrongBalances != 0 || keysWithoutLedger != 0 || fig.finalKeys != len(ledger) {
		fig.violate("final state: %d in progress, %d wrong balances, %d key rows without a ledger row, %d key rows for %d ledger keys",
			inProgress, wrongBalances, keysWithoutLedger, fig.finalKeys, len(ledger))
	}
	return fig
}

func (f *foFigures) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(label string, v any) { fmt.Fprintf(tw, "%s\t%v\t\n", label, v) }
	c := f.chk
	row("operations answered / scheduled", fmt.Sprintf("%d / %d", f.answered, f.ops))
	row("standby fell behind by", f.fp.cut)
	row("  its last received WAL at the cut", c.cutLSN)
	row("  at the crash: received / replayed", c.receivedLSN+" / "+c.replayedLSN)
	row("  the primary's WAL at the crash", c.primaryLSN)
	// The primary's position is read just before the stop command, and it
	// may write a little more before it dies: a standby that received to
	// the end shows a negative difference, which means nothing was missed.
	row("  WAL the standby never received (bytes, at least)", max(c.tailBytes, 0))
	if c.walCommitted+c.walCut > 0 {
		row("the standby's WAL from the run's start ("+c.startLSN+"), by pg_waldump:", "")
		row("  transactions committed", c.walCommitted)
		row("  transaction ids with records but no commit (a call has two: its own, its savepoint's)", c.walCut)
	}
	row("keys acknowledged by the old primary", c.acknowledged)
	row("promoted node, before any new write:", "")
	row("  key rows / ledger rows", fmt.Sprintf("%d / %d", c.keyRows, c.ledgerRows))
	row("  key rows without their ledger row", c.keysWithoutLedger)
	row("  ledger rows without their key row", c.ledgerWithoutKey)
	row("  keys in progress", c.inProgress)
	row("  balances that differ from the ledger", c.balancesWrong)
	row("  acknowledged keys present (answer equal)", fmt.Sprintf("%d (%d)", c.acknowledgedPresent, c.acknowledgedPresent-c.answersDiffer))
	row("  acknowledged keys lost with their ledger rows", c.acknowledgedLost)
	row("  committed keys whose answer the crash lost", c.unacknowledgedPresent)
	row("acknowledged keys sent again after the failover:", "")
	row("  replayed the answer the client had", f.resentReplayed)
	row("  ran again, once (their first run was lost)", f.resentExecuted)
	row("final: key rows / ledger rows", fmt.Sprintf("%d / %d", f.finalKeys, f.finalLedger))
	row("violations", len(f.violations))
	tw.Flush()
	for _, v := range f.violations {
		fmt.Fprintln(w, "VIOLATION:", v)
	}
	if len(f.violations) == 0 {
		fmt.Fprintln(w, "idem-load -failover: OK: on the promoted node every key row has its ledger row and every ledger row its key row; lost keys ran again once, kept keys replayed")
	} else {
		fmt.Fprintln(w, "idem-load -failover: FAILED")
	}
}

// dropOn drops database name on the server of serverURL.
func dropOn(serverURL, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	return err
}
