package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/callmetrics"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/spectest"
	"github.com/idemhq/idem/payments_example/processor"
	"github.com/idemhq/idem/testkit/testdb"
)

// childEnv, set to 1, makes the test binary run the command itself
// (main) instead of the tests: the kill tests (settle_test.go) start it as
// a child process, so that they can SIGKILL the service's real code, race
// detector included, while the processor and the client live on in the
// test process.
const childEnv = "PAYMENTS_EXAMPLE_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(testdb.Main(m))
}

// liveness bounds the tests below that wait for the server to do
// something: not a timing assertion, only a limit on a broken run.
const liveness = 60 * time.Second

// service is the command's server started by a test.
type service struct {
	addr        string
	metricsAddr string       // the internal listener's
	client      *http.Client // checks every request and answer against the spec
	stop        func() error // stops it as SIGTERM does and returns serve's error
}

func start(t *testing.T, pool *pgxpool.Pool, set settings) *service {
	t.Helper()
	if err := payments.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln, metricsLn, pool, slog.New(slog.NewTextHandler(io.Discard, nil)), set) }()
	var stopped bool
	var result error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			result = <-served
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	transport := &http.Transport{DisableKeepAlives: true}
	return &service{
		addr:        ln.Addr().String(),
		metricsAddr: metricsLn.Addr().String(),
		client:      &http.Client{Transport: spectest.New(t).Transport(t, transport)},
		stop:        stop,
	}
}

func (s *service) get(ctx context.Context, t *testing.T, path, apiKey string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	res, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, body
}

func (s *service) signUp(ctx context.Context, t *testing.T) api.AccountCreated {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.addr+"/accounts", strings.NewReader(`{"owner": "ada"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var a api.AccountCreated
	if err := json.NewDecoder(res.Body).Decode(&a); err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /accounts: %d %v", res.StatusCode, err)
	}
	return a
}

func (s *service) pay(ctx context.Context, t *testing.T, a api.AccountCreated, key string, amount int64) int {
	t.Helper()
	body := fmt.Sprintf(`{"account_id": %q, "amount": %d, "currency": "USD"}`, a.Id, amount)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.addr+"/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.ApiKey)
	req.Header.Set("Idempotency-Key", key)
	res, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	return res.StatusCode
}

// TestServe starts the command's server, signs up and pays through it, and
// stops it the way SIGTERM does: serve returns nil once it has shut down,
// its sweeper stopped (goleak, in TestMain, would find it otherwise).
func TestServe(t *testing.T) {
	pool := testdb.New(t)
	s := start(t, pool, defaultSettings())
	if status, body := s.get(t.Context(), t, "/healthz", ""); status != http.StatusOK {
		t.Fatalf("GET /healthz: %d %s", status, body)
	}
	a := s.signUp(t.Context(), t)
	if status := s.pay(t.Context(), t, a, "serve-1", 100); status != http.StatusCreated {
		t.Fatalf("POST /payments: %d", status)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve after shutdown: %v", err)
	}
}

// rawGet sends GET http://addr/path with a plain client: the internal
// listener, and the paths the spec does not have, are no part of the API.
func rawGet(t *testing.T, addr, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", addr, path, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, body
}

// TestMetrics checks GET /metrics as the service serves it, on its
// internal listener: after a payment and a retry of it, idem_calls_total
// counts one call executed and one replayed, both answered 201; the call
// duration and the key table's figures are there too; and nothing in the
// exposition names the account, its API key or the Idempotency-Key.
func TestMetrics(t *testing.T) {
	pool := testdb.New(t)
	s := start(t, pool, defaultSettings())
	a := s.signUp(t.Context(), t)
	const key = "metrics-payment-1"
	for i := range 2 {
		if status := s.pay(t.Context(), t, a, key, 100); status != http.StatusCreated {
			t.Fatalf("POST /payments, attempt %d: %d", i+1, status)
		}
	}
	status, body := rawGet(t, s.metricsAddr, "/metrics")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", status, body)
	}
	t.Logf("GET /metrics:\n%s", body)
	counts, err := callmetrics.Read(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	want := []callmetrics.Count{
		{Outcome: "executed", Status: "201", N: 1},
		{Outcome: "replayed", Status: "201", N: 1},
	}
	if !reflect.DeepEqual(counts, want) {
		t.Fatalf("idem_calls_total by outcome and status: %+v, want %+v", counts, want)
	}
	for _, series := range []string{
		`idem_calls_total{http_response_status_code="201",idem_outcome="replayed",`,
		`idem_duration_seconds_count{http_response_status_code="201",idem_outcome="executed",`,
		`idem_key_count{idem_key_state="in_progress",idem_table="idempotency_keys",`,
		`idem_table_size_bytes{idem_table="idempotency_keys",`,
	} {
		if !bytes.Contains(body, []byte(series)) {
			t.Errorf("GET /metrics has no series %s", series)
		}
	}
	for name, secret := range map[string]string{
		"the Idempotency-Key": key,
		"the API key":         a.ApiKey,
		"the account's scope": "account:" + a.Id.String(),
	} {
		if bytes.Contains(body, []byte(secret)) {
			t.Errorf("GET /metrics holds %s (%q)", name, secret)
		}
	}
}

// TestMetricsOnInternalListenerOnly is the review's finding: GET /metrics
// was served on the public listener, to anyone, with the payment volume,
// the decline rate, the keys in progress and the SDK versions. The public
// listener now answers it 404; the internal one serves the metrics and
// nothing else; and the internal listener's default address is loopback.
func TestMetricsOnInternalListenerOnly(t *testing.T) {
	pool := testdb.New(t)
	s := start(t, pool, defaultSettings())
	a := s.signUp(t.Context(), t)
	if status := s.pay(t.Context(), t, a, "internal-1", 100); status != http.StatusCreated {
		t.Fatalf("POST /payments: %d", status)
	}
	if status, body := rawGet(t, s.addr, "/metrics"); status != http.StatusNotFound || bytes.Contains(body, []byte("idem_")) {
		t.Fatalf("GET /metrics on the public listener: %d %.200s, want 404", status, body)
	}
	if status, body := rawGet(t, s.metricsAddr, "/metrics"); status != http.StatusOK || !bytes.Contains(body, []byte("idem_calls_total")) {
		t.Fatalf("GET /metrics on the internal listener: %d %.200s", status, body)
	}
	for _, path := range []string{"/healthz", "/openapi.yaml", "/accounts/" + a.Id.String()} {
		if status, _ := rawGet(t, s.metricsAddr, path); status != http.StatusNotFound {
			t.Errorf("GET %s on the internal listener: %d, want 404", path, status)
		}
	}
	host, _, err := net.SplitHostPort(defaultMetricsAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		t.Errorf("the default metrics address %q is not loopback", defaultMetricsAddr)
	}
}

// TestProcessorURLChecked is the review's finding: the processor's URL
// could be plain http to any host, so the charges, their keys and the
// processor's answers crossed the network in clear. The service refuses to
// start with one; https, and plain http on loopback (a local fake), pass.
func TestProcessorURLChecked(t *testing.T) {
	for u, ok := range map[string]bool{
		"http://processor.example.com":  false,
		"http://192.0.2.10:8090":        false,
		"https://processor.example.com": true,
		"http://127.0.0.1:8090":         true,
		"":                              true,
	} {
		set := defaultSettings()
		set.processorURL = u
		err := set.check()
		if ok != (err == nil) || (!ok && !errors.Is(err, processor.ErrInsecureURL)) {
			t.Errorf("processor %q: %v", u, err)
		}
	}
}

// TestSlowReadersDoNotStopTheService is the review's finding: clients that
// send a request and never read the answer froze the service. Each request
// here has a field name of nearly 1 MiB of '<' (whose escaped echo was a
// 6 MiB error body, written while the request held a database
// connection); four such clients on a pool of four connections must leave
// /healthz and payments answering.
func TestSlowReadersDoNotStopTheService(t *testing.T) {
	pool := testdb.New(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
	s := start(t, pool, defaultSettings())
	ctx, cancel := context.WithTimeout(t.Context(), liveness)
	defer cancel()
	a := s.signUp(ctx, t)

	body := `{"` + strings.Repeat("<", payments.MaxBodyBytes-64) + `": 1}`
	var dialer net.Dialer
	for i := range 4 {
		conn, err := dialer.DialContext(ctx, "tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		deadline, _ := ctx.Deadline()
		_ = conn.SetWriteDeadline(deadline)
		req := fmt.Sprintf("POST /payments HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nIdempotency-Key: slow-%d\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", s.addr, a.ApiKey, i, len(body), body)
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatalf("slow client %d: %v", i, err)
		}
		// It never reads.
	}

	if status, body := s.get(ctx, t, "/healthz", ""); status != http.StatusOK {
		t.Fatalf("GET /healthz with four silent clients: %d %s", status, body)
	}
	if status := s.pay(ctx, t, a, "after-slow", 100); status != http.StatusCreated {
		t.Fatalf("POST /payments with four silent clients: %d", status)
	}
}

// TestServerTimeouts checks that the server does not keep connections for
// clients that stall: one that never finishes its headers, one that never
// finishes its body, and an idle keep-alive connection are all closed by
// the server. The timeouts are shortened for the test; what is asserted is
// only that the server closes each connection, not when.
func TestServerTimeouts(t *testing.T) {
	set := defaultSettings()
	set.readHeaderTimeout = 200 * time.Millisecond
	set.readTimeout = 500 * time.Millisecond
	set.writeTimeout = 2 * time.Second
	set.idleTimeout = 200 * time.Millisecond
	s := start(t, testdb.New(t), set)

	for name, req := range map[string]string{
		"headers never finished": "GET /healthz HTTP/1.1\r\nHost: x\r\n",
		"body never finished":    "POST /accounts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"owner\"",
		"idle after an answer":   "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", s.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(liveness))
			if _, err := io.WriteString(conn, req); err != nil {
				t.Fatal(err)
			}
			// Read whatever the server answers until it closes the
			// connection; only our own deadline is a failure.
			_, err = io.Copy(io.Discard, bufio.NewReader(conn))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the server kept the connection open for %v", liveness)
			}
		})
	}
}

// TestSweeperRuns checks that the service deletes expired idempotency keys
// by itself: a key that expired a day ago is gone soon after start.
func TestSweeperRuns(t *testing.T) {
	pool := testdb.New(t)
	if err := payments.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(t.Context(), `insert into idempotency_keys
		(scope, idempotency_key, request_hash, status, created_at, completed_at, expires_at)
		values ('account:1', 'expired', 'h', 'completed', now() - interval '2 days', now() - interval '2 days', now() - interval '1 day')`)
	if err != nil {
		t.Fatal(err)
	}
	set := defaultSettings()
	set.sweepEvery = time.Hour // the first sweep runs at start
	s := start(t, pool, set)
	ctx, cancel := context.WithTimeout(t.Context(), liveness)
	defer cancel()
	for {
		var n int
		if err := pool.QueryRow(ctx, "select count(*) from idempotency_keys").Scan(&n); err != nil {
			t.Fatalf("the expired key is still there: %v", err)
		}
		if n == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
}
