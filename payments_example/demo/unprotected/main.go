// Command unprotected is the demo's service without idem: the payments
// example's API (payments.NewUnprotectedHandler) with each payment in a
// plain transaction and the Idempotency-Key ignored, settled at the
// processor inside the request with a new processor key per attempt
// (settlement.Direct). The demo runs it as a child process, as it runs
// the real service, to show what a retry costs without idem. Never serve
// it.
//
// Usage (the demo creates the tables first):
//
//	DATABASE_URL=postgres://... unprotected -addr 127.0.0.1:8081 -processor http://127.0.0.1:8090
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/settlement"
	"github.com/idemhq/idem/payments_example/processor"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "address to listen on, host:port")
	processorURL := flag.String("processor", "", "payment processor base URL (required)")
	flag.Parse()
	proc, err := processor.NewClient(*processorURL, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "unprotected:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Error("unprotected: database", "err", err)
		os.Exit(1)
	}
	defer pool.Close()
	srv := &http.Server{
		Addr:              *addr,
		Handler:           payments.NewUnprotectedHandler(pool, settlement.Direct{Processor: proc}, log),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Info("serving without idem", "addr", *addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Error("unprotected stopped", "err", err)
		os.Exit(1)
	}
}
