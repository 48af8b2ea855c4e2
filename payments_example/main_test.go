package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/idemhq/idem/internal/testdb"
	"github.com/idemhq/idem/payments_example/internal/payments"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// TestServe starts the command's server, pays through it, and stops it the
// way SIGTERM does: serve returns nil once it has shut down.
func TestServe(t *testing.T) {
	pool := testdb.New(t)
	if err := payments.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln, pool, slog.New(slog.NewTextHandler(io.Discard, nil))) }()

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	base := "http://" + ln.Addr().String()
	res, err := client.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %d", res.StatusCode)
	}
	res, err = client.Post(base+"/accounts", "application/json", strings.NewReader(`{"owner": "ada", "balance": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /accounts: %d", res.StatusCode)
	}

	stop()
	if err := <-served; err != nil {
		t.Fatalf("serve after shutdown: %v", err)
	}
}
