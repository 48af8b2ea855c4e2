// Command unprotected is the demo's service without idem: the payments
// example's API (payments.NewUnprotectedHandler) with each payment in a
// plain transaction and the Idempotency-Key ignored, settled at the
// processor inside the request with a new processor key per attempt
// (settlement.Direct); and, with -nats, the deposits of the NATS
// server's stream credited in a plain transaction per delivery, the
// message acknowledged after COMMIT (deposits.ConsumeUnprotected). The
// demo runs it as a child process, as it runs the real service, to show
// what a retry and a redelivery cost without idem. Never serve it.
//
// Usage (the demo creates the tables and the stream first):
//
//	DATABASE_URL=postgres://... unprotected -addr 127.0.0.1:8081 -processor http://127.0.0.1:8090 [-nats nats://127.0.0.1:4222]
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
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemhq/idem/payments_example/internal/deposits"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/settlement"
	"github.com/idemhq/idem/payments_example/processor"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "address to listen on, host:port")
	processorURL := flag.String("processor", "", "payment processor base URL (required)")
	natsURL := flag.String("nats", "", "NATS server URL whose deposits are credited (none: no deposits)")
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
	if *natsURL != "" {
		stop, err := consumeDeposits(ctx, *natsURL, pool, log)
		if err != nil {
			log.Error("unprotected: deposits", "err", err)
			os.Exit(1)
		}
		defer stop()
	}
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

// consumeDeposits credits the deposits of the NATS server at url without
// idem until ctx ends, and returns a function that waits for that and
// closes the connection.
func consumeDeposits(ctx context.Context, url string, pool *pgxpool.Pool, log *slog.Logger) (func(), error) {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	cons, err := deposits.Subscribe(ctx, js)
	if err != nil {
		nc.Close()
		return nil, err
	}
	var consumer sync.WaitGroup
	consumer.Go(func() {
		if err := deposits.ConsumeUnprotected(ctx, cons, pool, log); err != nil {
			log.Error("unprotected: deposits", "err", err)
		}
	})
	return func() { consumer.Wait(); nc.Close() }, nil
}
