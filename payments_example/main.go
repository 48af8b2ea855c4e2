// Command payments_example is a small payments service that charges each
// payment exactly once, however often a client retries it: the
// Idempotency-Key, the charge and the stored answer commit in one PostgreSQL
// transaction (package idem, through the idemhttp middleware).
//
// Usage:
//
//	DATABASE_URL=postgres://... go run ./payments_example -addr 127.0.0.1:8080
//
// The HTTP API is described in internal/payments (NewHandler). The service
// creates its tables on start if they are missing, and shuts down gracefully
// on SIGINT or SIGTERM. `make demo` (./demo) shows the guarantee against a
// network that loses answers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/payments_example/internal/payments"
)

// defaultDatabaseURL is used when DATABASE_URL is not set.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on, host:port")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: payments_example [-addr host:port]

A payments service that charges each payment exactly once per Idempotency-Key.

Environment:
  DATABASE_URL  PostgreSQL connection URL (default %s)

Flags:
`, defaultDatabaseURL)
		flag.PrintDefaults()
	}
	flag.Parse()

	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		dbURL = defaultDatabaseURL
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, dbURL, log); err != nil {
		log.Error("payments_example stopped", "err", err)
		os.Exit(1)
	}
}

// run connects, creates the tables, and serves on addr until ctx ends.
func run(ctx context.Context, addr, dbURL string, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(ctx, pool, log); err != nil {
		return err
	}
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return serve(ctx, ln, pool, log)
}

// serve serves the API on ln until ctx ends, then shuts down gracefully:
// the listener closes and requests in flight finish (up to 10s) before it
// returns.
func serve(ctx context.Context, ln net.Listener, pool *pgxpool.Pool, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           payments.NewHandler(pool, log),
		ReadHeaderTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String())

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// migrate creates the tables, waiting for the database if it is not up
// yet: the service starts listening, and /healthz answers 200, only once it
// can serve.
func migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	for {
		err := payments.Migrate(ctx, pool)
		if err == nil {
			return nil
		}
		log.Warn("database not ready, retrying", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}
