package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// The HTTP comparison serves the same business work (debit an account,
// append a ledger row, as workload.go) from two routes of one in-process
// net/http server: /idem under idemhttp, whose handler works in the
// request's transaction, and /bare, whose handler opens a pgx transaction of
// its own. Each writes to its own tables: /idem to public (where idem's key
// table is), /bare to bare.
const (
	routeIdem = "/idem"
	routeBare = "/bare"
)

// httpRequest is the JSON body every client sends.
type httpRequest struct {
	Account int64 `json:"account"`
	Amount  int64 `json:"amount"`
}

// respond shapes what a handler writes once the work has succeeded. size 0
// writes the receipt as JSON; otherwise size bytes of pad, in writes of
// chunk bytes (0: one write), as a handler that streams a large document
// into the ResponseWriter would. hold, if set, runs after the body is
// written and before the handler returns: the memory measurement parks
// requests there.
type respond struct {
	pad  []byte
	hold func()
}

// sizeParam is the query parameter that asks for a response of that many
// bytes; chunkParam, for writes of that many bytes each.
const (
	sizeParam  = "size"
	chunkParam = "chunk"
)

// write answers r with the receipt or the padded body, then holds.
func (o respond) write(w http.ResponseWriter, r *http.Request, rc receipt) {
	size, _ := strconv.Atoi(r.URL.Query().Get(sizeParam))
	chunk, _ := strconv.Atoi(r.URL.Query().Get(chunkParam))
	if size <= 0 {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rc)
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
		body := o.pad[:min(size, len(o.pad))]
		if chunk <= 0 {
			chunk = len(body)
		}
		for len(body) > 0 {
			n := min(chunk, len(body))
			// Past idemhttp's MaxResponseBytes the write fails; the
			// middleware answers for the handler, so the error is not ours.
			_, _ = w.Write(body[:n])
			body = body[n:]
		}
	}
	if o.hold != nil {
		o.hold()
	}
}

// readRequest decodes the body, answering 400 itself when it cannot.
func readRequest(w http.ResponseWriter, r *http.Request) (httpRequest, bool) {
	var req httpRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Account < 1 || req.Account > accounts {
		http.Error(w, "bad request", http.StatusBadRequest)
		return req, false
	}
	return req, true
}

// idemHandler does the work in the transaction idemhttp opened for the
// request: the work, the key and the stored response commit together.
func idemHandler(o respond) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, ok := readRequest(w, r)
		if !ok {
			return
		}
		ctx := r.Context()
		rc, err := doWork.run(ctx, idemhttp.Tx(ctx), req.Account, req.Amount)
		if err != nil {
			// 5xx: idemhttp rolls back and leaves the key free.
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		o.write(w, r, rc)
	}
}

// bareHandler does the same work in a transaction of its own and commits
// before it answers, as a handler without idempotency keys would.
func bareHandler(pool *pgxpool.Pool, o respond) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, ok := readRequest(w, r)
		if !ok {
			return
		}
		ctx := r.Context()
		var rc receipt
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			rc, err = bareWork.run(ctx, tx, req.Account, req.Amount)
			return err
		})
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		o.write(w, r, rc)
	}
}

// httpRig is one in-process server on loopback serving both routes on one
// pool, and the HTTP client that calls it.
type httpRig struct {
	srv    *http.Server
	ln     net.Listener
	base   string
	client *http.Client
}

// startRig serves both routes on pool. maxConns sizes the client's
// keep-alive pool, so that every client reuses one connection.
func startRig(ctx context.Context, pool *pgxpool.Pool, o respond, maxConns int) (*httpRig, error) {
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		return nil, err
	}
	// The answers over the cap are expected; the clients count them.
	quiet := slog.New(slog.DiscardHandler)
	mw, err := idemhttp.NewMiddleware(keys, &idemhttp.Config{Required: true, Logger: quiet})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+routeIdem, mw.Handler(idemHandler(o)))
	mux.Handle("POST "+routeBare, bareHandler(pool, o))
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rig := &httpRig{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		ln:   ln,
		base: "http://" + ln.Addr().String(),
		client: &http.Client{Transport: &http.Transport{
			MaxIdleConns:        maxConns,
			MaxIdleConnsPerHost: maxConns,
			DisableCompression:  true,
		}},
	}
	go func() { _ = rig.srv.Serve(ln) }()
	return rig, nil
}

// close stops the server, waiting for requests in progress, and closes the
// client's idle connections.
func (rig *httpRig) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = rig.srv.Shutdown(ctx)
	rig.client.CloseIdleConnections()
}

// post sends one request to route (with query, if any) under a new key, the
// way a client of an idempotent API does, reads the whole answer and
// reports any status but 200 as an error.
func (rig *httpRig) post(ctx context.Context, route, query string, account int64) error {
	body, err := json.Marshal(httpRequest{Account: account, Amount: 1})
	if err != nil {
		return err
	}
	url := rig.base + route
	if query != "" {
		url += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, uuid.NewString())
	resp, err := rig.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return &statusError{resp.StatusCode}
	}
	return err
}

// statusError is an answer other than 200.
type statusError struct{ status int }

// Error names the status.
func (e *statusError) Error() string { return fmt.Sprintf("HTTP %d", e.status) }

// statusOf is the status an error from post carries, 0 if none.
func statusOf(err error) int {
	if se, ok := errors.AsType[*statusError](err); ok {
		return se.status
	}
	return 0
}
