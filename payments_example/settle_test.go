package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/freeport"
	"github.com/idemhq/idem/payments_example/internal/settlement"
	"github.com/idemhq/idem/payments_example/internal/spectest"
	"github.com/idemhq/idem/payments_example/processor"
	"github.com/idemhq/idem/testkit/testdb"
)

// settleBound is the bound: every payment shows settled within
// this long of the last answer a client received, crashes included.
const settleBound = 60 * time.Second

// soak is one run of the service under failure: clients pay through it
// while it is killed and restarted, and the processor fails and loses
// answers.
type soak struct {
	payments, workers int
	kills             int     // SIGKILLs of the service, each followed by a restart
	restartDB         bool    // stop the database (immediate) and start it again, once; needs a cluster of the test's own
	fail, lose        float64 // the processor's FakeConfig
}

// TestSettleThroughKills is the short run that make test-long runs: 40
// payments, one SIGKILL of the service at a random point, a processor that
// fails 20% of its calls and loses 20% of its answers. It uses the shared
// PostgreSQL (a database of its own), which it never restarts.
func TestSettleThroughKills(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("a crash test: make test-long runs it (IDEM_TEST_LONG=1)")
	}
	t.Parallel()
	runSoak(t, testdb.URL(t), nil, soak{payments: 40, workers: 4, kills: 1, fail: 0.2, lose: 0.2})
}

// TestSettleThroughKillsAndRestarts is the long run (make settle-test,
// IDEM_SETTLE_TEST=1): 300 payments, three SIGKILLs of the service at
// random points, the database stopped in immediate mode and started again
// once, and the same processor faults. The database is a PostgreSQL
// cluster of the test's own (pg_createcluster), dropped at the end.
func TestSettleThroughKillsAndRestarts(t *testing.T) {
	if os.Getenv("IDEM_SETTLE_TEST") != "1" {
		t.Skip("the long run: make settle-test (IDEM_SETTLE_TEST=1)")
	}
	url, restart := ownCluster(t)
	runSoak(t, url, restart, soak{payments: 300, workers: 8, kills: 3, restartDB: true, fail: 0.2, lose: 0.2})
}

// runSoak runs cfg against the database at dbURL (restartDB restarts it)
// and asserts, from the processor's records and the database:
//
//   - every payment a client was answered 201 for is one payment row, and
//     there is no other;
//   - the processor charged every payment exactly once, under the key
//     derived from its request's, and charged nothing else (no charge for
//     a payment that did not commit);
//   - GET /payments/{id} shows every payment settled by that charge within
//     settleBound of the last answer;
//   - the processor never answered 422 (a key reused for another charge);
//   - there is one settlement job per payment, completed, and no key is
//     left in progress.
func runSoak(t *testing.T, dbURL string, restartDB func(), cfg soak) {
	ctx := t.Context()
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("IDEM_SETTLE_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (IDEM_SETTLE_SEED repeats the kill points)", seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	fake, err := processor.NewFake(processor.FakeConfig{FailRate: cfg.fail, LoseRate: cfg.lose, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	proc := httptest.NewServer(fake) // outlives every restart of the service
	defer proc.Close()

	svc := newChild(t, dbURL, proc.URL)
	svc.start()
	c := newSoakClient(t, svc.url)
	account := c.signUp(ctx)

	// Kill points: after a random share of the payments has been answered,
	// plus a random delay, so that kills land in the middle of requests
	// and jobs.
	var answered atomic.Int64
	type event struct {
		after int64
		kill  bool // else: restart the database
	}
	var events []event
	for range cfg.kills {
		events = append(events, event{after: int64(cfg.payments/10 + rng.IntN(cfg.payments*8/10)), kill: true})
	}
	if cfg.restartDB {
		events = append(events, event{after: int64(cfg.payments/10 + rng.IntN(cfg.payments*8/10))})
	}
	sort.Slice(events, func(i, j int) bool { return events[i].after < events[j].after })
	var chaos sync.WaitGroup
	var happened []string // what the chaos did, and when
	var when []time.Time
	trafficDone := make(chan struct{})
	chaos.Go(func() {
		for _, e := range events {
			for answered.Load() < e.after {
				select {
				case <-trafficDone:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
			time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
			when = append(when, time.Now())
			if e.kill {
				happened = append(happened, fmt.Sprintf("SIGKILL after %d answers", answered.Load()))
				svc.kill()
				svc.start()
			} else {
				happened = append(happened, fmt.Sprintf("database stopped after %d answers", answered.Load()))
				restartDB()
			}
		}
	})

	keys := make([]string, cfg.payments)
	paid := make([]api.Payment, cfg.payments)
	next := make(chan int)
	var workers sync.WaitGroup
	for w := range cfg.workers {
		// Paced, so that the run lasts long enough for the kills to land
		// in the middle of it.
		pace := rand.New(rand.NewPCG(seed, uint64(w)))
		workers.Go(func() {
			for i := range next {
				time.Sleep(time.Duration(pace.IntN(40)) * time.Millisecond)
				p, err := c.pay(ctx, account, keys[i], int64(100+i))
				if err != nil {
					t.Errorf("payment %d: %v", i, err)
				}
				paid[i] = p
				answered.Add(1)
			}
		})
	}
	for i := range keys {
		keys[i] = fmt.Sprintf("soak-%d-%d", seed, i)
		next <- i
	}
	close(next)
	workers.Wait()
	lastAnswer := time.Now()
	close(trafficDone)
	chaos.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Every payment settled within settleBound of the last answer.
	statuses, slowest := c.waitSettled(ctx, account, paid, lastAnswer.Add(settleBound))

	// Reconcile the processor with the database.
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	type row struct {
		account     uuid.UUID
		amount      int64
		processorID string
	}
	rows := map[uuid.UUID]row{}
	res, err := db.Query(ctx, "select id, account_id, amount, coalesce(processor_id, '') from payments")
	if err != nil {
		t.Fatal(err)
	}
	for res.Next() {
		var id uuid.UUID
		var r row
		if err := res.Scan(&id, &r.account, &r.amount, &r.processorID); err != nil {
			t.Fatal(err)
		}
		rows[id] = r
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) != cfg.payments {
		t.Errorf("%d payments committed for %d payments made", len(rows), cfg.payments)
	}
	keyOf := map[uuid.UUID]string{}
	for i, p := range paid {
		r, ok := rows[p.Id]
		switch {
		case !ok:
			t.Errorf("payment %d was answered 201 (id %s) and is not in the database", i, p.Id)
		case r.amount != int64(100+i) || r.account != account.Id:
			t.Errorf("payment %d: %+v", i, r)
		}
		keyOf[p.Id] = keys[i]
	}
	charges := fake.Charges()
	perPayment := map[uuid.UUID]int{}
	for _, ch := range charges {
		perPayment[ch.PaymentID]++
		r, ok := rows[ch.PaymentID]
		want := idem.CallKey{Scope: "account:" + account.Id.String(), Key: keyOf[ch.PaymentID]}.Derive(settlement.Purpose(ch.PaymentID))
		switch {
		case !ok:
			t.Errorf("charge %s for payment %s, which did not commit", ch.ID, ch.PaymentID)
		case r.processorID != ch.ID || *statuses[ch.PaymentID].ProcessorId != ch.ID:
			t.Errorf("payment %s shows charge %q (API %v), the processor charged %s", ch.PaymentID, r.processorID, statuses[ch.PaymentID].ProcessorId, ch.ID)
		case ch.Key != want || ch.Amount != r.amount || ch.AccountID != r.account:
			t.Errorf("charge %+v, want key %s for payment %+v", ch, want, r)
		}
	}
	for id := range rows {
		if perPayment[id] != 1 {
			t.Errorf("payment %s charged %d times at the processor", id, perPayment[id])
		}
	}
	stats := fake.Stats()
	if stats.Rejected != 0 {
		t.Errorf("the processor rejected %d calls (a key reused for another charge, or a malformed request)", stats.Rejected)
	}

	var jobs, completed, rescued, maxAttempt, inProgress int
	err = db.QueryRow(ctx, `select count(*), count(*) filter (where state = 'completed'),
		count(*) filter (where errors::text like '%Stuck job rescued%'), coalesce(max(attempt), 0)
		from river_job where kind = 'settle_payment'`).Scan(&jobs, &completed, &rescued, &maxAttempt)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, "select count(*) from idempotency_keys where status = 'in_progress'").Scan(&inProgress); err != nil {
		t.Fatal(err)
	}
	if jobs != cfg.payments || completed != jobs || inProgress != 0 {
		t.Errorf("%d settlement jobs, %d completed, %d keys in progress; want %d, all, none", jobs, completed, inProgress, cfg.payments)
	}

	svc.stop()
	t.Logf("payments %d (%d workers), service SIGKILLed %d times, database restarted %v; client retries %d",
		cfg.payments, cfg.workers, svc.kills, cfg.restartDB, c.retries.Load())
	t.Logf("processor: %d calls, %d charges, %d replays, %d failed (503), %d answers lost, %d rejected",
		stats.Calls, stats.Charges, stats.Replays, stats.Failed, stats.Lost, stats.Rejected)
	t.Logf("settlement jobs: %d, completed %d, rescued after a crash %d, most runs of one job %d",
		jobs, completed, rescued, maxAttempt)
	for i, what := range happened {
		t.Logf("%s, %.1fs before the last answer", what, lastAnswer.Sub(when[i]).Seconds())
	}
	t.Logf("every payment settled %.1fs after the last answer (bound %v)", slowest.Seconds(), settleBound)
}

// child is the service run as a child process of the test (see childEnv),
// on a fixed address so that it can be killed and started again.
type child struct {
	t            *testing.T
	url          string
	args, env    []string
	logPath      string
	mu           sync.Mutex
	cmd          *exec.Cmd
	done         chan error
	kills        int
	gracefulStop bool
}

func newChild(t *testing.T, dbURL, processorURL string) *child {
	t.Helper()
	addr, err := freeport.Addr(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	c := &child{
		t:   t,
		url: "http://" + addr,
		// No metrics listener (its fixed default port would be shared by
		// every child), and no rate limit: the soak pays as fast as it can.
		args: []string{"-addr", addr, "-metrics-addr=", "-processor", processorURL,
			"-payment-rate", "1000000", "-payment-burst", "1000000"},
		env:     append(os.Environ(), childEnv+"=1", "DATABASE_URL="+dbURL, "PROCESSOR_URL="),
		logPath: filepath.Join(t.TempDir(), "service.log"),
	}
	t.Cleanup(func() {
		c.stop()
		if t.Failed() {
			if b, err := os.ReadFile(c.logPath); err == nil {
				t.Logf("the service's log (last 4 KiB):\n%s", b[max(0, len(b)-4096):])
			}
		}
	})
	return c
}

// start starts the service and waits until /healthz answers 200.
func (c *child) start() {
	c.t.Helper()
	log, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], c.args...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		c.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); _ = log.Close() }()
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()

	deadline := time.Now().Add(liveness)
	for {
		select {
		case err := <-done:
			done <- err
			c.t.Fatalf("the service exited while starting: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.url+"/healthz", nil)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = res.Body.Close()
		}
		cancel()
		if err == nil && res.StatusCode == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the service did not become healthy within %v", liveness)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *child) kill() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.kills++
	c.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// stop stops the service as SIGTERM does, once, and fails the test if it
// does not exit cleanly (a race the race detector found exits 66).
func (c *child) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.gracefulStop {
		return
	}
	c.gracefulStop = true
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.done:
		if err != nil {
			c.t.Errorf("the service's graceful stop: %v", err)
		}
	case <-time.After(liveness):
		_ = c.cmd.Process.Kill()
		c.t.Errorf("the service did not stop within %v of SIGTERM", liveness)
	}
}

// soakClient is a careful client: it retries every payment with the same
// Idempotency-Key until it is answered 201. Every request and answer is
// checked against the spec.
type soakClient struct {
	t       *testing.T
	base    string
	http    *http.Client
	retries atomic.Int64
}

func newSoakClient(t *testing.T, base string) *soakClient {
	// One connection per request: net/http would otherwise resend a
	// request with an Idempotency-Key by itself when a kept-alive
	// connection breaks.
	transport := &http.Transport{DisableKeepAlives: true}
	return &soakClient{t: t, base: base, http: &http.Client{
		Transport: spectest.New(t).Transport(t, transport),
		Timeout:   10 * time.Second,
	}}
}

func (c *soakClient) do(ctx context.Context, method, path, apiKey, key string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

func (c *soakClient) signUp(ctx context.Context) api.AccountCreated {
	c.t.Helper()
	status, body, err := c.do(ctx, http.MethodPost, "/accounts", "", "", []byte(`{"owner": "soak"}`))
	var a api.AccountCreated
	if err != nil || status != http.StatusCreated || json.Unmarshal(body, &a) != nil {
		c.t.Fatalf("sign up: %d %s %v", status, body, err)
	}
	return a
}

// pay makes one payment, retrying with the same key until it is answered
// 201: after a broken connection (a kill, a lost answer), 409 (the first
// attempt still holds the key), and 5xx (the database restarting).
func (c *soakClient) pay(ctx context.Context, a api.AccountCreated, key string, amount int64) (api.Payment, error) {
	body := fmt.Appendf(nil, `{"account_id": %q, "amount": %d, "currency": "USD"}`, a.Id, amount)
	wait := 50 * time.Millisecond
	deadline := time.Now().Add(5 * liveness)
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			c.retries.Add(1)
			time.Sleep(wait)
			wait = min(2*wait, time.Second)
		}
		status, answer, err := c.do(ctx, http.MethodPost, "/payments", a.ApiKey, key, body)
		switch {
		case ctx.Err() != nil:
			return api.Payment{}, ctx.Err()
		case time.Now().After(deadline):
			return api.Payment{}, fmt.Errorf("still failing after %v: %d %w", 5*liveness, status, err)
		case err != nil, status == http.StatusConflict, status >= 500:
			continue
		case status != http.StatusCreated:
			return api.Payment{}, fmt.Errorf("status %d: %s", status, answer)
		}
		var p api.Payment
		return p, json.Unmarshal(answer, &p)
	}
}

// waitSettled polls GET /payments/{id} for every payment of paid until all
// are settled, failing the test at deadline. It returns the last answer
// for each, and how long after deadline-settleBound the last one settled.
func (c *soakClient) waitSettled(ctx context.Context, a api.AccountCreated, paid []api.Payment, deadline time.Time) (map[uuid.UUID]api.PaymentStatus, time.Duration) {
	c.t.Helper()
	got := map[uuid.UUID]api.PaymentStatus{}
	pending := make([]uuid.UUID, 0, len(paid))
	for _, p := range paid {
		pending = append(pending, p.Id)
	}
	for {
		var still []uuid.UUID
		for _, id := range pending {
			status, body, err := c.do(ctx, http.MethodGet, "/payments/"+id.String(), a.ApiKey, "", nil)
			var p api.PaymentStatus
			if err != nil || status != http.StatusOK || json.Unmarshal(body, &p) != nil || !p.Settled {
				still = append(still, id)
				continue
			}
			got[id] = p
		}
		if len(still) == 0 {
			return got, time.Since(deadline.Add(-settleBound))
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%d of %d payments not settled %v after the last answer: %v", len(still), len(paid), settleBound, still[:min(len(still), 20)])
		}
		pending = still
		time.Sleep(200 * time.Millisecond)
	}
}

// ownCluster creates and starts a PostgreSQL cluster of the test's own
// (the shared server must never be restarted), dropped when t ends, and
// returns its URL and a function that stops it in immediate mode (a crash:
// no checkpoint, connections cut) and starts it again.
func ownCluster(t *testing.T) (string, func()) {
	t.Helper()
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(versions) == 0 {
		t.Fatal("no PostgreSQL server installed (/usr/lib/postgresql/*/bin/postgres): run make postgres as root")
	}
	slices.SortFunc(versions, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(a))))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(b))))
		return va - vb
	})
	version := filepath.Base(filepath.Dir(filepath.Dir(versions[len(versions)-1])))
	name := fmt.Sprintf("idem_settle_%d", os.Getpid())
	addr, err := freeport.Addr(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)

	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("pg_createcluster", version, name, "-p", port, "--", "--auth=trust")
	t.Cleanup(func() {
		if out, err := exec.Command("pg_dropcluster", "--stop", version, name).CombinedOutput(); err != nil {
			t.Errorf("pg_dropcluster: %v\n%s", err, out)
		}
	})
	ctl := func(action string, more ...string) {
		run(append([]string{"pg_ctlcluster", "--skip-systemctl-redirect", version, name, action}, more...)...)
	}
	ctl("start")
	url := "postgres://postgres@127.0.0.1:" + port + "/postgres?sslmode=disable"
	t.Logf("own cluster %s/%s on port %s", version, name, port)
	return url, func() {
		ctl("stop", "-m", "immediate")
		time.Sleep(time.Second) // clients meet a database that is down
		ctl("start")
	}
}
