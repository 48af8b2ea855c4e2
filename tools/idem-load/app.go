package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// The crash test's application: an HTTP service that runs each operation
// through idemhttp in its own process, so that the process can be killed
// while clients (in the parent) keep retrying. Its one endpoint:
//
//	POST /ops  Idempotency-Key: <key>  {"account": 7, "amount": 1234}
//	201 {"id": <ledger row id>, "amount": 1234}
//
// The operation inserts the ledger row and adds the amount to the account's
// balance, in the transaction that holds the key. A database error answers
// 503, which idemhttp does not store: the key stays free for the retry.

// crashSQL is the crash test's business schema: a ledger whose idem_key is
// deliberately not unique, and balances the operations move.
const crashSQL = `CREATE TABLE accounts (
    id      int    PRIMARY KEY,
    balance bigint NOT NULL DEFAULT 0
);
INSERT INTO accounts (id) SELECT generate_series(0, 99);
CREATE TABLE ledger (
    id       bigserial PRIMARY KEY,
    idem_key text   NOT NULL,
    account  int    NOT NULL REFERENCES accounts,
    amount   bigint NOT NULL
)`

// opRequest is the body of POST /ops.
type opRequest struct {
	Account int   `json:"account"`
	Amount  int64 `json:"amount"`
}

// accountOf is the account a key's operation moves money on.
func accountOf(key string) int { return int(amountOf(key) % 100) }

// runApp serves POST /ops on listen until SIGTERM or SIGINT. It prints
// "listening <addr>" on stdout once it accepts connections.
func runApp(dbURL, listen string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		return err
	}
	// The clients count every answer; the service's own logs would only
	// repeat each 503 of a database crash.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mw, err := idemhttp.NewMiddleware(keys, &idemhttp.Config{Required: true, Logger: quiet})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /ops", handleOp)
	ln, err := new(net.ListenConfig).Listen(context.Background(), "tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mw.Handler(mux), ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("listening %s\n", ln.Addr())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func handleOp(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req opRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 || req.Account < 0 || req.Account > 99 {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	key, _ := idem.KeyFromContext(ctx)
	tx := idemhttp.Tx(ctx)
	e := entry{Amount: req.Amount}
	err := tx.QueryRow(ctx, "INSERT INTO ledger (idem_key, account, amount) VALUES ($1, $2, $3) RETURNING id",
		key.Key, req.Account, req.Amount).Scan(&e.ID)
	if err == nil {
		_, err = tx.Exec(ctx, "UPDATE accounts SET balance = balance + $2 WHERE id = $1", req.Account, req.Amount)
	}
	if err != nil {
		// Not stored: the transaction rolls back and the key stays free.
		http.Error(w, "database: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(e)
}

// appMain is the -app role's entry point.
func appMain(dbURL, listen string) {
	if err := runApp(dbURL, listen); err != nil {
		fmt.Fprintln(os.Stderr, "idem-load app:", err)
		os.Exit(1)
	}
}

// libApp is the crash test's built-in application: idem-load itself with
// -app, each process an HTTP service of POST /ops through idemhttp.
type libApp struct {
	self string // idem-load's executable
	p    plan
}

func (l *libApp) describe() string    { return "the built-in idemhttp application" }
func (l *libApp) businessSQL() string { return crashSQL }

// launch starts an application process and waits for its "listening"
// line.
func (l *libApp) launch(dbURL, addr string) (*process, string, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	// The application lives until it is killed or the run ends; no context
	// of the caller's governs it.
	cmd := exec.CommandContext(context.Background(), l.self, "-app", "-worker-url="+dbURL, "-listen="+addr)
	cmd.Stderr = os.Stderr
	out, w, err := os.Pipe()
	if err != nil {
		return nil, "", err
	}
	cmd.Stdout = w
	proc, err := startProcess(cmd)
	_ = w.Close() // the child has its own copy
	if err != nil {
		_ = out.Close()
		return nil, "", err
	}
	got := make(chan string, 1)
	go func() {
		defer out.Close()
		lines := bufio.NewScanner(out)
		if lines.Scan() {
			got <- lines.Text()
		}
		close(got)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line := <-got:
		listening, ok := strings.CutPrefix(line, "listening ")
		if !ok {
			proc.kill()
			return nil, "", fmt.Errorf("said %q", line)
		}
		return proc, listening, nil
	case <-time.After(time.Minute):
		proc.kill()
		return nil, "", errors.New("did not listen within a minute")
	}
}

func (l *libApp) prepare(context.Context, *apps) error { return nil }

func (l *libApp) freshKey(c, i int) opKey { return opKey{key: l.p.freshKey(0, c, i)} }

func (l *libApp) request(ctx context.Context, addr string, k opKey) (*http.Request, error) {
	body, _ := json.Marshal(opRequest{Account: accountOf(k.key), Amount: amountOf(k.key)})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/ops", unrewindable(body))
	if err != nil {
		return nil, err
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", k.key)
	return req, nil
}

func (l *libApp) final(status int) bool { return status == http.StatusCreated }

func (l *libApp) finish(context.Context, string, *apps, [][]opResult) {}

// reconcile decodes each answer and checks them against the ledger.
func (l *libApp) reconcile(ctx context.Context, dbURL string, results [][]opResult, fig *crashFigures) error {
	for _, rs := range results {
		for i := range rs {
			r := &rs[i]
			if r.err != "" {
				continue
			}
			if err := json.Unmarshal(r.body, &r.entry); err != nil {
				fig.violate("%s: undecodable answer %q: %v", r.opKey, r.body, err)
			}
		}
	}
	return reconcileCrash(ctx, dbURL, results, fig)
}
