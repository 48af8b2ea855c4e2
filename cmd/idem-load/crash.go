package main

import (
	"bufio"
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
// The pieces are kept apart so that another service can take the
// application's place: the apps are any processes that print
// "listening <addr>" and serve the operation over HTTP; the clients only
// need a request per operation and a way to read the answer; the
// reconciliation reads the business tables.

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

// opResult is one operation as its client saw it, through every attempt.
type opResult struct {
	class     string
	key       string
	entry     entry
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

// apps runs the application processes and restarts them on the same
// addresses.
type apps struct {
	self, dbURL string
	mu          sync.Mutex
	cmds        []*exec.Cmd
	addrs       []string
}

// start starts application i on its address (any free port the first
// time) and waits until it listens.
func (a *apps) start(i int) error {
	listen := "127.0.0.1:0"
	a.mu.Lock()
	if a.addrs[i] != "" {
		listen = a.addrs[i]
	}
	a.mu.Unlock()
	// The application lives until it is killed or the run ends; no context
	// of the caller's governs it.
	cmd := exec.CommandContext(context.Background(), a.self, "-app", "-worker-url="+a.dbURL, "-listen="+listen)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := bufio.NewScanner(out)
	got := make(chan string, 1)
	go func() {
		if lines.Scan() {
			got <- lines.Text()
		}
		close(got)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line := <-got:
		addr, ok := strings.CutPrefix(line, "listening ")
		if !ok {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("application %d said %q", i, line)
		}
		a.mu.Lock()
		a.cmds[i], a.addrs[i] = cmd, addr
		a.mu.Unlock()
		return nil
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("application %d did not listen within a minute", i)
	}
}

// kill kills application i with SIGKILL and reaps it.
func (a *apps) kill(i int) {
	a.mu.Lock()
	cmd := a.cmds[i]
	a.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// stop ends every application gracefully.
func (a *apps) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, cmd := range a.cmds {
		if cmd != nil && cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	}
}

func (a *apps) addr(i int) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.addrs[i%len(a.addrs)]
}

// runCrash is the parent of a crash run. It returns the exit status.
func runCrash(p plan, cp crashPlan, keep bool) int {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout+time.Minute)
	defer cancel()
	serverURL, adminURL := serverURLs()
	name := fmt.Sprintf("idem_crash_%d", os.Getpid())
	dbURL, drop, err := createDatabase(ctx, adminURL, serverURL, name, crashSQL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-load:", err)
		return 1
	}
	if keep {
		fmt.Fprintf(os.Stderr, "idem-load: keeping database %s\n", name)
	} else {
		defer drop()
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-load:", err)
		return 1
	}
	a := &apps{self: self, dbURL: dbURL, cmds: make([]*exec.Cmd, cp.apps), addrs: make([]string, cp.apps)}
	defer a.stop()
	for i := range cp.apps {
		if err := a.start(i); err != nil {
			fmt.Fprintln(os.Stderr, "idem-load:", err)
			return 1
		}
	}
	fmt.Printf("idem-load -crash: %d application processes, %d clients, %d operations, seed %d, faults %v, database %s\n",
		cp.apps, p.clients, p.ops, p.seed, cp.faults, name)

	began := time.Now()
	var answered atomic.Int64
	clientsDone := make(chan struct{})
	var (
		records []faultRecord
		chaosWG sync.WaitGroup
	)
	chaosWG.Go(func() { records = inject(ctx, cp, a, &answered, p.ops, clientsDone) })

	results := make([][]opResult, p.clients)
	hc := &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: p.clients, MaxConnsPerHost: 2 * p.clients},
	}
	var wg sync.WaitGroup
	for c := range p.clients {
		wg.Go(func() { results[c] = runCrashClient(ctx, hc, a, p, cp, c, &answered) })
	}
	wg.Wait()
	close(clientsDone)
	chaosWG.Wait()
	elapsed := time.Since(began)
	a.stop()

	fig, err := reconcileCrash(ctx, dbURL, results, records, len(cp.faults))
	if err != nil {
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
	all := make([]int, len(a.cmds))
	for i := range all {
		all[i] = i
	}
	var killed []int
	switch f.kind {
	case "app":
		killed = []int{f.app}
	case "apps", "all":
		killed = all
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

// runCrashClient sends client c's operations, each until it is answered.
func runCrashClient(ctx context.Context, hc *http.Client, a *apps, p plan, cp crashPlan, c int, answered *atomic.Int64) []opResult {
	rng := p.clientRand(0, c)
	n := p.clientCalls(0, c)
	out := make([]opResult, 0, n)
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
		out = append(out, sendOp(ctx, hc, a, cp, c, class, key))
		answered.Add(1)
	}
	return out
}

// sendOp sends one operation until it is answered, with the same key on
// every attempt, moving to the next application after each failure as a
// load balancer would.
func sendOp(ctx context.Context, hc *http.Client, a *apps, cp crashPlan, c int, class, key string) opResult {
	r := opResult{class: class, key: key, start: time.Now()}
	body, _ := json.Marshal(opRequest{Account: accountOf(key), Amount: amountOf(key)})
	deadline := r.start.Add(cp.opTimeout)
	backoff := 20 * time.Millisecond
	var last string
	for attempt := 0; ; attempt++ {
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.err = fmt.Sprintf("gave up after %d attempts; last: %s", r.attempts, last)
			return r
		}
		r.attempts++
		sent := time.Now()
		// A body the request cannot rewind: net/http would otherwise resend
		// a request carrying an Idempotency-Key by itself when a reused
		// connection fails, and the lost answer would go uncounted.
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a.addr(c+attempt)+"/ops", io.NopCloser(bytes.NewReader(body)))
		if err != nil {
			r.err = err.Error()
			return r
		}
		req.ContentLength = int64(len(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
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
			case resp.StatusCode == http.StatusCreated:
				if err := json.Unmarshal(data, &r.entry); err != nil {
					r.err = fmt.Sprintf("undecodable answer %q: %v", data, err)
					return r
				}
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
