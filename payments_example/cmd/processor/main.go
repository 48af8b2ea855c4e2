// Command processor serves a fake payment processor (package processor's
// Fake) for trying the payments service by hand:
//
//	go run ./cmd/processor -addr 127.0.0.1:8090 -fail 0.1 -lose 0.2 &
//	go run . -processor http://127.0.0.1:8090
//
// It charges once per Idempotency-Key, fails a share of the calls (503
// before charging) and loses a share of the answers (charges, then closes
// the connection). GET /charges shows its statistics and every charge;
// they live in memory until it stops, on SIGINT or SIGTERM.
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

	"github.com/idemhq/idem/payments_example/processor"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "address to listen on, host:port")
	var cfg processor.FakeConfig
	flag.Float64Var(&cfg.FailRate, "fail", 0, "share of calls answered 503 before charging, in [0, 1)")
	flag.Float64Var(&cfg.LoseRate, "lose", 0, "share of answers lost after charging, in [0, 1)")
	flag.Uint64Var(&cfg.Seed, "seed", 1, "decides which calls fail and which answers are lost")
	flag.Parse()

	fake, err := processor.NewFake(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	srv := &http.Server{Addr: *addr, Handler: fake, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Info("fake processor serving", "addr", *addr, "fail", cfg.FailRate, "lose", cfg.LoseRate)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Error("fake processor stopped", "err", err)
		os.Exit(1)
	}
	s := fake.Stats()
	log.Info("fake processor stopped", "calls", s.Calls, "charges", s.Charges, "replays", s.Replays,
		"failed", s.Failed, "lost", s.Lost, "rejected", s.Rejected)
}
