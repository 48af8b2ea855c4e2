package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/faultproxy"
	"github.com/idemhq/idem/testkit/testdb"
)

// The fault and pause tests of operations need an owner that can be killed
// (SIGKILL) or stopped (SIGSTOP) as a whole process: the test binary runs
// itself as that owner when ownerEnv holds its settings, before TestMain,
// so the owner creates no database and runs no test. It reaches the test's
// database through the test's fault proxy, and its processor over HTTP, so
// that the processor's record of charges outlives the owner.

// ownerEnv carries an ownerConfig, as JSON, to the owner process.
const ownerEnv = "IDEM_TEST_OPERATION_OWNER"

func init() {
	if cfg := os.Getenv(ownerEnv); cfg != "" {
		os.Exit(runOwner(cfg))
	}
}

// ownerConfig is what the owner process runs.
type ownerConfig struct {
	URL         string        // the test database, through the fault proxy
	App         string        // the application_name of its sessions
	Processor   string        // the processor's HTTP address
	Key         string        // the operation's key
	Amount      int64         // the request
	Lease       time.Duration // OperationConfig.Lease
	IdleTimeout time.Duration // Config.IdleTimeout; 0: the default
	// Deadline is OperationConfig.Deadline (0: none), with a Compensate
	// that refuses: the owner that began the operation sets it.
	Deadline time.Duration
	// Stop is the boundary (opPoint) where the owner says "at <Stop>" on
	// its standard output and waits for a line on its standard input
	// before it goes on: the moment the test kills or stops it.
	Stop string
}

// ownerResult is how the owner's Run ended, as it reports it.
type ownerResult struct {
	Outcome   string     `json:"outcome"`
	Err       string     `json:"err,omitempty"`
	LeaseLost bool       `json:"lease_lost"` // errors.Is(err, idem.ErrLeaseLost)
	Resp      chargeResp `json:"resp"`
}

// runOwner is the owner process: one Run of the charge operation.
func runOwner(raw string) int {
	var cfg ownerConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "owner:", err)
		return 2
	}
	ctx := context.Background()
	pool, err := ownerPool(ctx, cfg.URL, cfg.App)
	if err != nil {
		fmt.Fprintln(os.Stderr, "owner:", err)
		return 2
	}
	defer pool.Close()
	client, err := idem.NewClient(pool, &idem.Config{IdleTimeout: cfg.IdleTimeout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "owner:", err)
		return 2
	}
	in := bufio.NewReader(os.Stdin)
	at := func(_ context.Context, point opPoint, _ pgx.Tx) error {
		if string(point) != cfg.Stop {
			return nil
		}
		fmt.Printf("at %s\n", point)
		if _, err := in.ReadString('\n'); err != nil {
			os.Exit(3) // the test is gone
		}
		return nil
	}
	opCfg := &idem.OperationConfig[chargeReq, chargeResp]{Lease: cfg.Lease}
	if cfg.Deadline > 0 {
		opCfg.Deadline = cfg.Deadline
		opCfg.Compensate = func(*idem.Steps, chargeReq, error) (chargeResp, error) {
			return chargeResp{}, idem.Refuse("expired", "not charged")
		}
	}
	op, err := idem.NewOperation(client, "charge", boundarySteps(httpCharger(cfg.Processor), at), opCfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "owner:", err)
		return 2
	}
	resp, outcome, err := op.Run(ctx, cfg.Key, chargeReq{Amount: cfg.Amount})
	res := ownerResult{Outcome: outcome.String(), LeaseLost: errors.Is(err, idem.ErrLeaseLost), Resp: resp}
	if err != nil {
		res.Err = err.Error()
	}
	out, _ := json.Marshal(res)
	fmt.Printf("result %s\n", out)
	return 0
}

// ownerPool is an owner's pool on url, its sessions named app, by which
// pg_terminate_backend finds them. It hands out its idle connections
// without pinging them first (pgxpool pings one idle for over a second),
// so that a connection a fault ended is the next statement's fault, as it
// is within that second, however slow the machine.
func ownerPool(ctx context.Context, url, app string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	return pgxpool.NewWithConfig(ctx, cfg)
}

// An opPoint is a boundary of the charge operation, where boundarySteps
// calls its hook.
type opPoint string

// The boundaries of boundarySteps: before each database step's
// transaction, inside it after its write (the hook gets the step's
// transaction), and after its COMMIT, before whatever comes next. The
// external step's boundaries are the processor's own hooks (before it
// acts, after it acted).
const (
	reserveBefore opPoint = "reserve:before"
	reserveInside opPoint = "reserve:inside"
	reserveAfter  opPoint = "reserve:after"
	receiptBefore opPoint = "receipt:before"
	receiptInside opPoint = "receipt:inside"
	receiptAfter  opPoint = "receipt:after"
)

// A charger charges amount under the idempotency key key at the processor.
type charger func(ctx context.Context, key string, amount int64) (string, error)

// boundarySteps is the charge operation of chargeSteps (reserve, charge,
// receipt, on the same tables), calling at at every boundary of its
// database steps; an error from at fails the operation there. The external
// step charges through charge.
func boundarySteps(charge charger, at func(ctx context.Context, point opPoint, tx pgx.Tx) error) func(st *idem.Steps, req chargeReq) (chargeResp, error) {
	return func(st *idem.Steps, req chargeReq) (chargeResp, error) {
		key := st.Key().Key
		ctx := st.Context()
		if err := at(ctx, reserveBefore, nil); err != nil {
			return chargeResp{}, err
		}
		if _, err := idem.Step(st, "reserve", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO op_reservations VALUES ($1, $2)", key, req.Amount); err != nil {
				return 0, err
			}
			return req.Amount, at(ctx, reserveInside, tx)
		}); err != nil {
			return chargeResp{}, err
		}
		if err := at(ctx, reserveAfter, nil); err != nil {
			return chargeResp{}, err
		}
		id, err := idem.External(st, "charge", func(ctx context.Context, pkey string) (string, error) {
			return charge(ctx, pkey, req.Amount)
		})
		if err != nil {
			return chargeResp{}, err
		}
		if err := at(ctx, receiptBefore, nil); err != nil {
			return chargeResp{}, err
		}
		resp, err := idem.Step(st, "receipt", func(ctx context.Context, tx pgx.Tx) (chargeResp, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO op_receipts VALUES ($1, $2)", key, id); err != nil {
				return chargeResp{}, err
			}
			return chargeResp{ChargeID: id, Amount: req.Amount}, at(ctx, receiptInside, tx)
		})
		if err != nil {
			return chargeResp{}, err
		}
		return resp, at(ctx, receiptAfter, nil)
	}
}

// noHooks is the hook of an owner that injects nothing.
func noHooks(context.Context, opPoint, pgx.Tx) error { return nil }

// serveProcessor serves p over HTTP for owner processes, until the test
// ends: POST /charge?key=...&amount=... answers the charge's id, or 502
// with the error.
func serveProcessor(t *testing.T, p *processor) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		amount, err := strconv.ParseInt(r.URL.Query().Get("amount"), 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id, err := p.Charge(r.Context(), r.URL.Query().Get("key"), amount)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_, _ = io.WriteString(w, id)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// httpCharger charges at the processor that serveProcessor serves at base.
func httpCharger(base string) charger {
	return func(ctx context.Context, key string, amount int64) (string, error) {
		u := base + "/charge?" + url.Values{"key": {key}, "amount": {strconv.FormatInt(amount, 10)}}.Encode()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
		if err != nil {
			return "", err
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return "", err
		}
		if res.StatusCode != http.StatusOK {
			return "", fmt.Errorf("processor: %s: %s", res.Status, bytes.TrimSpace(body))
		}
		return string(body), nil
	}
}

// ownerProcess is a running owner process.
type ownerProcess struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string   // its standard output, line by line; closed at EOF
	read   chan struct{} // closed once its standard output is read to EOF
	stderr *syncBuffer

	mu     sync.Mutex
	waited bool
	state  *os.ProcessState
}

// startOwner starts an owner process with cfg; the test's end kills it if
// it still runs.
func startOwner(t *testing.T, cfg ownerConfig) *ownerProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), ownerEnv+"="+string(raw))
	o := &ownerProcess{t: t, cmd: cmd, lines: make(chan string, 16), read: make(chan struct{}), stderr: &syncBuffer{}}
	cmd.Stderr = o.stderr
	if o.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(o.read)
		defer close(o.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			o.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		for range o.lines {
		}
		o.wait()
	})
	return o
}

// syncBuffer is a bytes.Buffer that the process's output and the test may
// use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// next returns the owner's next line of output; "" once it ended.
func (o *ownerProcess) next() string {
	o.t.Helper()
	select {
	case line, ok := <-o.lines:
		if !ok {
			return ""
		}
		return line
	case <-time.After(time.Minute):
		o.t.Fatalf("the owner said nothing for a minute; its stderr: %s", o.stderr)
		return ""
	}
}

// reach waits until the owner says it is at point, and fails the test if
// it ends first.
func (o *ownerProcess) reach(point opPoint) {
	o.t.Helper()
	want := "at " + string(point)
	for {
		line := o.next()
		switch {
		case line == want:
			return
		case line == "":
			o.t.Fatalf("the owner ended before %s; its stderr: %s", point, o.stderr)
		case strings.HasPrefix(line, "result "):
			o.t.Fatalf("the owner finished before %s: %s", point, line)
		}
	}
}

// proceed lets an owner waiting at its Stop point go on.
func (o *ownerProcess) proceed() {
	o.t.Helper()
	if _, err := io.WriteString(o.stdin, "go\n"); err != nil {
		o.t.Fatalf("owner: %v", err)
	}
}

// signal sends sig to the owner.
func (o *ownerProcess) signal(sig syscall.Signal) {
	o.t.Helper()
	if err := o.cmd.Process.Signal(sig); err != nil {
		o.t.Fatalf("owner: %v: %v", sig, err)
	}
}

// kill sends the owner SIGKILL; safe to call from any goroutine (a
// processor hook, a proxy rule).
func (o *ownerProcess) kill() {
	_ = o.cmd.Process.Kill()
}

// result waits for the owner's report and its end.
func (o *ownerProcess) result() ownerResult {
	o.t.Helper()
	for {
		line := o.next()
		if line == "" {
			o.t.Fatalf("the owner ended without a result: %v; its stderr: %s", o.wait(), o.stderr)
		}
		if raw, ok := strings.CutPrefix(line, "result "); ok {
			var r ownerResult
			if err := json.Unmarshal([]byte(raw), &r); err != nil {
				o.t.Fatal(err)
			}
			if st := o.wait(); !st.Success() {
				o.t.Fatalf("the owner exited %v; its stderr: %s", st, o.stderr)
			}
			return r
		}
	}
}

// killed waits for the owner, which the test killed, to end, and checks
// that SIGKILL ended it.
func (o *ownerProcess) killed() {
	o.t.Helper()
	for o.next() != "" {
	}
	st := o.wait()
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		o.t.Fatalf("the owner ended with %v, not by SIGKILL; its stderr: %s", st, o.stderr)
	}
}

// wait waits for the process once its output is read to EOF, as
// StdoutPipe requires.
func (o *ownerProcess) wait() *os.ProcessState {
	<-o.read
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.waited {
		o.waited = true
		_ = o.cmd.Wait()
		o.state = o.cmd.ProcessState
	}
	return o.state
}

// opRig is one case of the operation's fault tests: a database with the
// charge operation's tables (its own, or shared by the cases of a sweep,
// each with keys of its own), a fault proxy in front of it, and a
// processor, for owners in this process and in others.
type opRig struct {
	t       *testing.T
	pool    *pgxpool.Pool // the database, directly
	client  *idem.Client  // on pool
	proc    *processor
	proxy   *faultproxy.Proxy
	proxied string // the database's URL through the proxy
	app     string // the application_name of the case's owners
	lease   time.Duration
}

// newOpRig returns a case on a database of its own.
func newOpRig(t *testing.T, lease time.Duration) *opRig {
	t.Helper()
	s := newOpSetup(t, nil)
	return rigOn(t, s.pool, s.client, "idem-owner", lease)
}

// rigOn returns a case on the database of pool, whose owners' sessions are
// named app.
func rigOn(t *testing.T, pool *pgxpool.Pool, client *idem.Client, app string, lease time.Duration) *opRig {
	t.Helper()
	u := pool.Config().ConnString()
	hp, err := testdb.HostPort(u)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(hp)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the pools' cleanups, so it runs after them.
	t.Cleanup(func() { p.Close() })
	return &opRig{t: t, pool: pool, client: client, proc: newProcessor(), proxy: p,
		proxied: testdb.WithHostPort(u, p.Addr()), app: app, lease: lease}
}

// ownerPool returns a pool through the proxy whose sessions are named
// r.app, closed when the test ends.
func (r *opRig) ownerPool() *pgxpool.Pool {
	r.t.Helper()
	pool, err := ownerPool(context.Background(), r.proxied, r.app)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(pool.Close)
	return pool
}

// op returns the charge operation (boundarySteps with at, charging at the
// processor in this process) on a Client of pool.
func (r *opRig) op(pool *pgxpool.Pool, cfg *idem.Config, at func(context.Context, opPoint, pgx.Tx) error) *idem.Operation[chargeReq, chargeResp] {
	r.t.Helper()
	client, err := idem.NewClient(pool, cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	op, err := idem.NewOperation(client, "charge", boundarySteps(r.proc.Charge, at),
		&idem.OperationConfig[chargeReq, chargeResp]{Lease: r.lease})
	if err != nil {
		r.t.Fatal(err)
	}
	return op
}

// owner starts an owner process for key, stopping at stop ("" for none).
func (r *opRig) owner(key string, amount int64, stop opPoint, idle time.Duration) *ownerProcess {
	r.t.Helper()
	return startOwner(r.t, ownerConfig{
		URL: r.proxied, App: r.app, Processor: serveProcessor(r.t, r.proc), Key: key, Amount: amount,
		Lease: r.lease, IdleTimeout: idle, Stop: string(stop),
	})
}

// terminateOwners ends every session of the case's owners with
// pg_terminate_backend. It does not wait for them to end: a backend told
// to end, busy or idle, ends at its next read of the connection, so the
// next statement on each of them fails; waiting would give the lease's
// renewals time to meet the dead connections first.
func (r *opRig) terminateOwners(ctx context.Context) error {
	_, err := r.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, r.app)
	return err
}

// count runs a count(*) query and returns the number.
func (r *opRig) count(sql string, args ...any) int {
	r.t.Helper()
	var n int
	if err := r.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		r.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// rowsOf counts the rows of key in each step's table.
func (r *opRig) rowsOf(key string) (reservations, receipts int) {
	return r.count("SELECT count(*) FROM op_reservations WHERE key = $1", key),
		r.count("SELECT count(*) FROM op_receipts WHERE key = $1", key)
}

// unfinished counts the rows that say key's operation is not finished.
func (r *opRig) unfinished(key string) int {
	return r.count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1 AND status = 'unfinished'", key) +
		r.count("SELECT count(*) FROM idempotency_keys_operations WHERE idempotency_key = $1", key)
}

// steps lists the recorded steps of key, as "name@token".
func (r *opRig) steps(key string) []string {
	r.t.Helper()
	rows, err := r.pool.Query(context.Background(),
		"SELECT step || '@' || token FROM idempotency_keys_steps WHERE idempotency_key = $1 ORDER BY step", key)
	if err != nil {
		r.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// token returns the fencing token of key's unfinished operation and its
// attempts.
func (r *opRig) token(key string) (token int64, attempts int) {
	r.t.Helper()
	if err := r.pool.QueryRow(context.Background(),
		"SELECT token, attempts FROM idempotency_keys_operations WHERE idempotency_key = $1", key).Scan(&token, &attempts); err != nil {
		r.t.Fatalf("the operation of %s: %v", key, err)
	}
	return token, attempts
}
