package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The crash test (-crash): clients in this process send operations to
// -apps application processes (app.go) over HTTP, retrying every failure
// with the same key, while the run kills the applications with SIGKILL and
// crashes PostgreSQL (-db-stop, -db-start) at set points of its progress.
// At the end every operation must have been answered, each key committed
// exactly once with the answer every client got, the balances exact and no
// key left in progress.
//
// The service is a crashService: the built-in application (libApp) or the
// payments example (paymentsService, -payments). The run owns the
// database, the faults, the clients and their retries and the fault
// figures; the service says how its processes start and are known to
// serve, what an operation's request is, which answers end it, and what
// the database must hold afterwards.

// crashPlan is the shape of a crash run, on top of plan's schedule.
type crashPlan struct {
	apps      int
	faults    []fault
	dbStop    string        // shell command that crashes the database
	dbStart   string        // shell command that starts it again
	dbDown    time.Duration // how long the database stays down
	opTimeout time.Duration // a client gives up on an operation after this
}

// A fault is one crash, injected when the run has answered at percent of
// its operations.
type fault struct {
	kind    string // "app" (one application), "apps" (all), "db", "all" (the database and every application)
	app     int    // for "app"
	percent int
}

func (f fault) String() string {
	if f.kind == "app" {
		return fmt.Sprintf("app%d@%d", f.app, f.percent)
	}
	return fmt.Sprintf("%s@%d", f.kind, f.percent)
}

// defaultFaults: one application killed, the database crashed, every
// application killed at once, the database and the applications crashed
// together, the other application killed, and the database again.
const defaultFaults = "app0@10,db@25,apps@40,all@55,app1@70,db@85"

// parseFaults reads "app0@15,db@30,...": kind@percent of the operations.
func parseFaults(s string, apps int) ([]fault, error) {
	var out []fault
	last := 0
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		kind, pct, ok := strings.Cut(item, "@")
		p, err := strconv.Atoi(pct)
		if !ok || err != nil || p <= last || p >= 100 {
			return nil, fmt.Errorf("fault %q: want kind@percent, percents rising between 1 and 99", item)
		}
		last = p
		f := fault{kind: kind, percent: p}
		switch {
		case kind == "db" || kind == "apps" || kind == "all":
		case strings.HasPrefix(kind, "app"):
			n, err := strconv.Atoi(kind[3:])
			if err != nil || n < 0 || n >= apps {
				return nil, fmt.Errorf("fault %q: no application %s (there are %d)", item, kind[3:], apps)
			}
			f.kind, f.app = "app", n
		default:
			return nil, fmt.Errorf("fault %q: unknown kind (app<n>, apps, db, all)", item)
		}
		out = append(out, f)
	}
	return out, nil
}

// faultRecord is what happened when a fault was injected.
type faultRecord struct {
	fault
	at   time.Time // injection began
	dead time.Time // what it crashes was certainly down: killed and reaped, or the stop command returned
	up   time.Time // everything it stopped was running again
	err  error
}

// opKey names one operation: an idempotency key and the principal that
// sends it (its number among the service's principals, from 1; 0 for a
// service without principals). Keys are unique per principal, as the
// service scopes them.
type opKey struct {
	principal int
	key       string
}

func (k opKey) String() string {
	if k.principal == 0 {
		return "key " + k.key
	}
	return fmt.Sprintf("key %s of principal %d", k.key, k.principal)
}

// opResult is one operation as its client saw it, through every attempt.
type opResult struct {
	class     string
	opKey            // the operation; key is also its Idempotency-Key
	status    int    // the final answer's status
	body      []byte // the final answer's body
	entry     entry  // the library application's answer, decoded from body
	replayed  bool
	err       string // why the client gave up; "" once answered
	attempts  int
	start     time.Time // first attempt sent
	lastStart time.Time // the answered attempt sent
	end       time.Time // answered
	// Why attempts failed.
	refused        int // no application listening
	noAnswer       int // the connection failed after the request was sent: outcome unknown to the client
	inProgress     int // 409
	outcomeUnknown int // 503 outcome-unknown: the service lost its connection during COMMIT
	unavailable    int // 503 unavailable: the database could not be reached, nothing happened
	failed         int // 503 from the operation itself (a database error mid-way), nothing stored
}

// lostBefore reports whether an attempt before the answered one may have
// acted without its answer reaching the client.
func (r *opResult) lostBefore() bool { return r.noAnswer > 0 || r.outcomeUnknown > 0 }

// A crashService is what a crash run drives: libApp (app.go) or
// paymentsService (payments.go).
type crashService interface {
	// describe names the service in the run's first line.
	describe() string
	// businessSQL is applied with idem's schema to the run's database; ""
	// when the service makes its own tables.
	businessSQL() string
	// launch starts an application process on the database at dbURL,
	// serving on addr ("" the first time: it picks an address), and
	// returns it once it serves requests, with the address it serves on.
	launch(dbURL, addr string) (*process, string, error)
	// prepare runs once every application serves, before the clients
	// start (the payments service's sign-ups).
	prepare(ctx context.Context, a *apps) error
	// freshKey is the key of client c's i-th operation when it is a new
	// one.
	freshKey(c, i int) opKey
	// request is one attempt of operation k, sent to the application at
	// addr.
	request(ctx context.Context, addr string, k opKey) (*http.Request, error)
	// final reports whether an answer with this status ends an operation;
	// 409 and 503 never do, and any other status fails the run.
	final(status int) bool
	// finish runs after the clients and the faults, with every
	// application serving: checks that need the service (a last replay of
	// every key, settlement).
	finish(ctx context.Context, dbURL string, a *apps, results [][]opResult)
	// reconcile checks the answers (already tallied in fig) against the
	// database at dbURL and adds its figures and violations to fig.
	reconcile(ctx context.Context, dbURL string, results [][]opResult, fig *crashFigures) error
}

// A process is an application process of the run.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited and been reaped
}

// startProcess starts cmd and reaps it when it exits.
func startProcess(cmd *exec.Cmd) (*process, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// kill kills the process with SIGKILL and waits until it is reaped.
func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop ends the process with SIGTERM, or SIGKILL if it is still there
// after 30 s.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.kill()
	}
}

// apps runs the application processes and restarts them on the same
// addresses.
type apps struct {
	svc   crashService
	dbURL string
	mu    sync.Mutex
	procs []*process
	addrs []string
}

func newApps(svc crashService, dbURL string, n int) *apps {
	return &apps{svc: svc, dbURL: dbURL, procs: make([]*process, n), addrs: make([]string, n)}
}

// start starts application i on its address (one the service picks the
// first time) and waits until it serves.
func (a *apps) start(i int) error {
	a.mu.Lock()
	addr := a.addrs[i]
	a.mu.Unlock()
	p, addr, err := a.svc.launch(a.dbURL, addr)
	if err != nil {
		return fmt.Errorf("application %d: %w", i, err)
	}
	a.mu.Lock()
	a.procs[i], a.addrs[i] = p, addr
	a.mu.Unlock()
	return nil
}

// kill kills application i with SIGKILL and reaps it.
func (a *apps) kill(i int) {
	a.mu.Lock()
	p := a.procs[i]
	a.mu.Unlock()
	p.kill()
}

// stop ends every application gracefully.
func (a *apps) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.procs {
		if p != nil {
			p.stop()
		}
	}
}

func (a *apps) count() int { return len(a.addrs) }

func (a *apps) addr(i int) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.addrs[i%len(a.addrs)]
}

// runCrash is the parent of a crash run of svc. It returns the exit
// status.
func runCrash(p plan, cp crashPlan, svc crashService, keep bool) int {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout+time.Minute)
	defer cancel()
	serverURL, adminURL := serverURLs()
	name := fmt.Sprintf("idem_crash_%d", os.Getpid())
	dbURL, drop, err := createDatabase(ctx, adminURL, serverURL, name, svc.businessSQL())
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-load:", err)
		return 1
	}
	if keep {
		fmt.Fprintf(os.Stderr, "idem-load: keeping database %s\n", name)
	} else {
		defer drop()
	}
	a := newApps(svc, dbURL, cp.apps)
	defer a.stop()
	// One at a time: the first start creates the service's tables.
	for i := range cp.apps {
		if err := a.start(i); err != nil {
			fmt.Fprintln(os.Stderr, "idem-load:", err)
			return 1
		}
	}
	if err := svc.prepare(ctx, a); err != nil {
		fmt.Fprintln(os.Stderr, "idem-load:", err)
		return 1
	}
	fmt.Printf("idem-load -crash: %s, %d application processes, %d clients, %d operations, seed %d, faults %v, database %s\n",
		svc.describe(), cp.apps, p.clients, p.ops, p.seed, cp.faults, name)

	began := time.Now()
	var answered atomic.Int64
	clientsDone := make(chan struct{})
	var (
		records []faultRecord
		chaosWG sync.WaitGroup
	)
	chaosWG.Go(func() { records = inject(ctx, cp, a, &answered, p.ops, clientsDone) })

	results := make([][]opResult, p.clients)
	hc := crashHTTPClient(p.clients)
	var wg sync.WaitGroup
	for c := range p.clients {
		wg.Go(func() { results[c] = runCrashClient(ctx, hc, a, p, cp, c, &answered) })
	}
	wg.Wait()
	close(clientsDone)
	chaosWG.Wait()
	elapsed := time.Since(began)
	svc.finish(ctx, dbURL, a, results)
	a.stop()

	fig := tally(results, records, len(cp.faults))
	if err := svc.reconcile(ctx, dbURL, results, fig); err != nil {
		fmt.Fprintln(os.Stderr, "idem-load: reconcile:", err)
		return 1
	}
	fig.elapsed = elapsed
	fig.print(os.Stdout, began)
	if len(fig.violations) > 0 {
		return 1
	}
	return 0
}

// crashHTTPClient is the clients' HTTP client.
func crashHTTPClient(clients int) *http.Client {
	return &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: 2 * clients},
	}
}

// inject waits for each fault's point of progress and injects it, until
// the clients are done. It returns what it did.
func inject(ctx context.Context, cp crashPlan, a *apps, answered *atomic.Int64, total int, clientsDone <-chan struct{}) []faultRecord {
	var out []faultRecord
	for _, f := range cp.faults {
		threshold := int64(total * f.percent / 100)
		for answered.Load() < threshold {
			select {
			case <-clientsDone:
				return out
			case <-ctx.Done():
				return out
			case <-time.After(20 * time.Millisecond):
			}
		}
		rec := faultRecord{fault: f, at: time.Now()}
		rec.err = crash(ctx, cp, a, f, &rec.dead)
		rec.up = time.Now()
		out = append(out, rec)
		if rec.err != nil {
			fmt.Fprintf(os.Stderr, "idem-load: fault %v: %v\n", f, rec.err)
		}
	}
	return out
}

// crash injects one fault, notes in *dead when what it crashed is certainly
// down, and brings back what it stopped.
func crash(ctx context.Context, cp crashPlan, a *apps, f fault, dead *time.Time) error {
	var killed []int
	switch f.kind {
	case "app":
		killed = []int{f.app}
	case "apps", "all":
		for i := range a.count() {
			killed = append(killed, i)
		}
	}
	for _, i := range killed {
		a.kill(i)
	}
	*dead = time.Now()
	var errs []error
	if f.kind == "db" || f.kind == "all" {
		if err := shell(ctx, cp.dbStop); err != nil {
			errs = append(errs, fmt.Errorf("stop the database: %w", err))
		}
		*dead = time.Now()
		time.Sleep(cp.dbDown)
		if err := shell(ctx, cp.dbStart); err != nil {
			errs = append(errs, fmt.Errorf("start the database: %w", err))
		}
	}
	for _, i := range killed {
		if err := a.start(i); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func shell(ctx context.Context, command string) error {
	if command == "" {
		return errors.New("no command given (-db-stop, -db-start)")
	}
	out, err := exec.CommandContext(ctx, "sh", "-c", command).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", command, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// scheduled is one operation of a client's schedule.
type scheduled struct {
	class string
	opKey
}

// crashSchedule is client c's operations: each a new key (fresh gives it)
// or, at the plan's retry rate, a key the client already sent and had
// answered. It derives from the plan's seed alone.
func crashSchedule(p plan, c int, fresh func(c, i int) opKey) []scheduled {
	rng := p.clientRand(0, c)
	n := p.clientCalls(0, c)
	out := make([]scheduled, 0, n)
	var used []opKey
	for i := range n {
		op := scheduled{classFresh, fresh(c, i)}
		if len(used) > 0 && rng.Float64() < p.retryProb() {
			op = scheduled{classRetry, used[rng.IntN(len(used))]}
		} else {
			used = append(used, op.opKey)
		}
		out = append(out, op)
	}
	return out
}

// runCrashClient sends client c's operations, each until it is answered.
func runCrashClient(ctx context.Context, hc *http.Client, a *apps, p plan, cp crashPlan, c int, answered *atomic.Int64) []opResult {
	ops := crashSchedule(p, c, a.svc.freshKey)
	out := make([]opResult, 0, len(ops))
	for _, op := range ops {
		if ctx.Err() != nil {
			break
		}
		out = append(out, sendOp(ctx, hc, a, cp.opTimeout, c, op.class, op.opKey))
		answered.Add(1)
	}
	return out
}

// sendOp sends one operation until it is answered, with the same key on
// every attempt, moving to the next application after each failure as a
// load balancer would (starting at application c).
func sendOp(ctx context.Context, hc *http.Client, a *apps, timeout time.Duration, c int, class string, k opKey) opResult {
	r := opResult{class: class, opKey: k, start: time.Now()}
	deadline := r.start.Add(timeout)
	backoff := 20 * time.Millisecond
	var last string
	for attempt := 0; ; attempt++ {
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.err = fmt.Sprintf("gave up after %d attempts; last: %s", r.attempts, last)
			return r
		}
		r.attempts++
		sent := time.Now()
		// The request's body must not be rewindable (no GetBody): net/http
		// would otherwise resend a request carrying an Idempotency-Key by
		// itself when a reused connection fails, and the lost answer would
		// go uncounted.
		req, err := a.svc.request(ctx, a.addr(c+attempt), k)
		if err != nil {
			r.err = err.Error()
			return r
		}
		resp, err := hc.Do(req)
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				r.refused++
			} else {
				r.noAnswer++
			}
			last = err.Error()
		} else {
			data, readErr := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case readErr != nil:
				r.noAnswer++
				last = readErr.Error()
			case a.svc.final(resp.StatusCode):
				r.status, r.body = resp.StatusCode, data
				r.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
				r.lastStart, r.end = sent, time.Now()
				return r
			case resp.StatusCode == http.StatusConflict:
				r.inProgress++
			case resp.StatusCode == http.StatusServiceUnavailable:
				var problem struct {
					Type string `json:"type"`
				}
				_ = json.Unmarshal(data, &problem)
				switch problem.Type {
				case "/problems/outcome-unknown":
					r.outcomeUnknown++
				case "/problems/unavailable":
					r.unavailable++
				default:
					r.failed++
				}
			default:
				// Nothing else is retryable: the run has failed.
				r.err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(data)))
				return r
			}
			if readErr == nil {
				last = fmt.Sprintf("HTTP %d %s", resp.StatusCode, strings.TrimSpace(string(data)))
			}
		}
		sleep := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, 500*time.Millisecond)
		select {
		case <-ctx.Done():
		case <-time.After(sleep):
		}
	}
}

// unrewindable is a request body that net/http cannot rewind (see sendOp).
func unrewindable(body []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(body)) }
