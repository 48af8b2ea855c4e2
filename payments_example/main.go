// Command payments_example is a small payments service that charges each
// payment exactly once, however often a client retries it: the
// Idempotency-Key, the charge and the stored answer commit in one PostgreSQL
// transaction (package idem, through the idemhttp middleware).
//
// Usage:
//
//	DATABASE_URL=postgres://... go run . -addr 127.0.0.1:8080 -processor http://127.0.0.1:8090
//
// The HTTP API is described in openapi.yaml and served on -addr, with its
// spec at GET /openapi.yaml; internal/payments implements it. The
// service's metrics for Prometheus are served apart, at GET /metrics on
// -metrics-addr (METRICS_ADDR; loopback by default), a listener for the
// operator's network only: they tell payment volume, decline rates and
// keys in progress, which are no client's business. They are idem's
// (package idemotel, on an OpenTelemetry MeterProvider read by the
// OpenTelemetry Prometheus exporter), such as idem_calls_total by outcome
// and HTTP status. Clients sign up with POST /accounts and send the API
// key they receive as "Authorization: Bearer"; idempotency keys are
// scoped by it, and each account may send -payment-rate payments a
// second (bursts of -payment-burst). The service creates its tables on
// start if they are missing (River's too, with rivermigrate), deletes
// expired idempotency keys every -sweep-every, and shuts down gracefully
// on SIGINT or SIGTERM. `make demo` (./demo) shows the guarantee against
// a network that loses answers.
//
// With a payment processor (-processor, or PROCESSOR_URL; the flag wins),
// every committed payment is also charged at the processor, exactly once:
// POST /payments inserts a settlement job in the payment's transaction,
// and a River client in this process runs it (internal/settlement). The
// processor's URL must be https, except on loopback; the service refuses
// to start otherwise. Without one, payments are not settled.
// ./cmd/processor is a fake processor to try it with.
//
// With a processor, POST /charges also charges synchronously: the amount
// is taken, the processor called with no transaction open, and its charge
// recorded, in steps of an idem.Operation (internal/payments.Charges),
// before the answer. A charge whose client stops waiting is finished by
// the same River client: the operation's first transaction inserts a
// completer job (package idemriver), scheduled half a -charge-lease past
// the lease, which resumes it from its last recorded step.
//
// With a NATS server (-nats, or NATS_URL; the flag wins), the service also
// credits accounts with the deposits announced on its JetStream stream
// DEPOSITS (internal/deposits), each exactly once however often it is
// delivered: the credit and the event's key (its Nats-Msg-Id) commit in
// one transaction, through idemconsume and idemnats, and the message is
// acknowledged after that. It makes the stream if it is missing, and its
// durable consumer "deposits". The metrics count the deliveries by what
// became of them (deposits_messages_total). Without one, no deposits are
// consumed.
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
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/idemriver"
	"github.com/idemhq/idem/payments_example/internal/deposits"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/settlement"
	"github.com/idemhq/idem/payments_example/processor"
)

// defaultDatabaseURL is used when DATABASE_URL is not set.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// defaultMetricsAddr is where GET /metrics is served when neither
// -metrics-addr nor METRICS_ADDR says: the loopback interface, on the
// OpenTelemetry Prometheus exporter's usual port. When another process
// holds that port (a second instance on one machine), the service serves
// its metrics on an ephemeral port instead and logs it (listenMetrics).
const defaultMetricsAddr = "127.0.0.1:9464"

// The server's limits on slow or silent clients. Without them, a client
// that sends its request slowly, or never reads its answer, holds a
// connection and a goroutine for as long as it likes.
const (
	// ReadHeaderTimeout bounds the time to send the request line and
	// headers.
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout bounds the time to send the whole request, body included
	// (up to 1 MiB).
	ReadTimeout = 30 * time.Second
	// WriteTimeout bounds the time from the end of the request's headers
	// to the end of the answer: the handler's work and the writing of the
	// answer to a client that does not read it.
	WriteTimeout = 30 * time.Second
	// IdleTimeout closes a keep-alive connection that carries no request.
	IdleTimeout = 60 * time.Second
	// MaxHeaderBytes bounds the request line and headers.
	MaxHeaderBytes = 64 << 10
	// shutdownTimeout bounds a graceful shutdown: requests in flight get
	// this long to finish, and then settlement jobs in flight as long
	// again; jobs still running after that are cancelled and run again
	// later.
	shutdownTimeout = 10 * time.Second
)

// settings is what serve needs besides the listener and the database.
type settings struct {
	sweepEvery time.Duration // how often expired idempotency keys are deleted
	// processorURL is the payment processor's base URL; empty: payments
	// are not settled.
	processorURL string
	// paymentRate and paymentBurst bound each account's POST /payments
	// (payments.Config).
	paymentRate  rate.Limit
	paymentBurst int
	// chargeLease is the lease of POST /charges's operation
	// (payments.ChargesConfig.Lease).
	chargeLease time.Duration
	// natsURL is the NATS server whose deposits are credited; empty: none
	// are.
	natsURL string
	// The server's timeouts; the constants above in production, shorter in
	// tests.
	readHeaderTimeout, readTimeout, writeTimeout, idleTimeout time.Duration
}

func defaultSettings() settings {
	return settings{
		sweepEvery:        time.Minute,
		paymentRate:       payments.DefaultPaymentRate,
		paymentBurst:      payments.DefaultPaymentBurst,
		chargeLease:       idem.DefaultLease,
		readHeaderTimeout: ReadHeaderTimeout,
		readTimeout:       ReadTimeout,
		writeTimeout:      WriteTimeout,
		idleTimeout:       IdleTimeout,
	}
}

func main() {
	set := defaultSettings()
	addr := flag.String("addr", "127.0.0.1:8080", "address of the API, host:port")
	metricsAddr := flag.String("metrics-addr", envOr("METRICS_ADDR", defaultMetricsAddr),
		"address of GET /metrics, host:port, for the operator's network only (default $METRICS_ADDR, else "+defaultMetricsAddr+
			", or an ephemeral port when another process holds it; port 0: an ephemeral port; the address is logged; empty: no metrics served)")
	flag.DurationVar(&set.sweepEvery, "sweep-every", set.sweepEvery, "how often to delete expired idempotency keys")
	flag.StringVar(&set.processorURL, "processor", os.Getenv("PROCESSOR_URL"),
		"payment processor base URL, https unless on loopback; every payment is settled there (default $PROCESSOR_URL; none: payments are not settled)")
	paymentRate := flag.Float64("payment-rate", float64(set.paymentRate), "POST /payments per second and account, sustained")
	flag.IntVar(&set.paymentBurst, "payment-burst", set.paymentBurst, "POST /payments per account at once, after a pause")
	flag.DurationVar(&set.chargeLease, "charge-lease", set.chargeLease,
		"lease of a POST /charges operation: how soon one whose service died is taken up again (at least 100ms)")
	flag.StringVar(&set.natsURL, "nats", os.Getenv("NATS_URL"),
		"NATS server URL; the deposits of its JetStream stream DEPOSITS are credited to their accounts (default $NATS_URL; none: no deposits are consumed)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: payments_example [-addr host:port] [-metrics-addr host:port] [-sweep-every 1m]
       [-processor URL] [-payment-rate 5] [-payment-burst 10] [-charge-lease 30s] [-nats URL]

A payments service that charges each payment exactly once per Idempotency-Key,
settles each at the payment processor exactly once, and credits each deposit
of a NATS JetStream stream exactly once.

Environment:
  DATABASE_URL   PostgreSQL connection URL (default %s)
  PROCESSOR_URL  payment processor base URL, if -processor is not given
  METRICS_ADDR   address of GET /metrics, if -metrics-addr is not given
  NATS_URL       NATS server URL, if -nats is not given

Server timeouts: headers %v, request %v, answer %v, idle connection %v.

Flags:
`, defaultDatabaseURL, ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout)
		flag.PrintDefaults()
	}
	flag.Parse()
	// Only the default gives way to an ephemeral port: an address the
	// operator chose is what a scrape config names, so it is used or the
	// service does not start.
	_, envAddr := os.LookupEnv("METRICS_ADDR")
	metricsFallback := !envAddr && !isFlagSet("metrics-addr")
	set.paymentRate = rate.Limit(*paymentRate)
	if err := set.check(); err != nil {
		fmt.Fprintln(os.Stderr, "payments_example:", err)
		os.Exit(2)
	}

	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		dbURL = defaultDatabaseURL
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The OpenTelemetry SDK's own errors (a failed read of the key table's
	// figures for a scrape, say) go to the service's log.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("metrics", "err", err) }))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *metricsAddr, metricsFallback, dbURL, log, set); err != nil {
		log.Error("payments_example stopped", "err", err)
		os.Exit(1)
	}
}

// isFlagSet reports whether the command line gave the flag name.
func isFlagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// envOr returns the environment variable name, or def when it is unset.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// check refuses settings the service cannot start with: a processor URL
// that processor.NewClient refuses (plain http beyond loopback, say), a
// sweep interval or a rate limit that is not positive.
func (set settings) check() error {
	if set.sweepEvery <= 0 {
		return errors.New("-sweep-every must be positive")
	}
	if set.paymentRate <= 0 || set.paymentBurst <= 0 {
		return errors.New("-payment-rate and -payment-burst must be positive")
	}
	if set.chargeLease < 100*time.Millisecond {
		return errors.New("-charge-lease must be at least 100ms")
	}
	if set.processorURL != "" {
		if _, err := processor.NewClient(set.processorURL, nil); err != nil {
			return fmt.Errorf("-processor: %w", err)
		}
	}
	return nil
}

// run connects, creates the tables, and serves the API on addr and the
// metrics on metricsAddr (none if empty; see listenMetrics for
// metricsFallback) until ctx ends.
func run(ctx context.Context, addr, metricsAddr string, metricsFallback bool, dbURL string, log *slog.Logger, set settings) error {
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
	var metricsLn net.Listener
	if metricsAddr != "" {
		if metricsLn, err = listenMetrics(ctx, metricsAddr, metricsFallback, log); err != nil {
			_ = ln.Close()
			return err
		}
	}
	return serve(ctx, ln, metricsLn, pool, log, set)
}

// listenMetrics listens on addr for GET /metrics and logs the address it
// got (port 0 asks for an ephemeral one). When addr is taken and fallback
// is set (addr is the default, which nobody asked for), it listens on an
// ephemeral port of the same host instead, with a warning: a second
// instance on one machine starts rather than exits, and its log says where
// its metrics are. An address the operator gave is never replaced.
func listenMetrics(ctx context.Context, addr string, fallback bool, log *slog.Logger) (net.Listener, error) {
	lc := new(net.ListenConfig)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil && fallback && errors.Is(err, syscall.EADDRINUSE) {
		host, _, _ := net.SplitHostPort(addr)
		if ln, err = lc.Listen(ctx, "tcp", net.JoinHostPort(host, "0")); err == nil {
			log.Warn("metrics: the default address is in use (another instance?); serving metrics on an ephemeral port instead",
				"default", addr, "addr", ln.Addr().String())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	log.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return ln, nil
}

// serve serves the API on ln, and GET /metrics on metricsLn if it is not
// nil, and consumes the deposits if set.natsURL says where, until ctx
// ends, then shuts down gracefully: the listeners close, requests in
// flight finish (up to 10s), settlement jobs in flight finish (up to 10s
// more), the deposit in hand is settled or abandoned, the sweeper stops,
// and the metrics' MeterProvider shuts down, before it returns. The API never serves the metrics: they
// are for the operator's network, not for clients.
func serve(ctx context.Context, ln, metricsLn net.Listener, pool *pgxpool.Pool, log *slog.Logger, set settings) (err error) {
	closeAll := func() {
		_ = ln.Close()
		if metricsLn != nil {
			_ = metricsLn.Close()
		}
	}
	mp, metrics, err := newMetrics(ctx, log)
	if err != nil {
		closeAll()
		return err
	}
	// Deferred first, so it runs last: nothing records any more.
	defer func() { err = errors.Join(err, mp.Shutdown(context.WithoutCancel(ctx))) }()
	// One idem.Client holds the deployment's key settings; the middleware,
	// the deposits consumer and the sweeper share it. Its Observer counts
	// every call in the metrics (idem_calls_total, idem_duration_seconds);
	// its Logger receives failed sweeps.
	obs := idemotel.New(idemotel.WithMeterProvider(mp))
	keys, err := idem.NewClient(pool, &idem.Config{Observer: obs, Logger: log})
	if err != nil {
		closeAll()
		return err
	}
	// The key table's health (idem_key_count and the others), read at
	// each scrape.
	stats, err := idemotel.RegisterStats(keys, idemotel.WithMeterProvider(mp))
	if err != nil {
		closeAll()
		return err
	}
	defer func() { err = errors.Join(err, stats.Unregister()) }()
	var (
		settler payments.Settler  // nil: no settlement
		charges *payments.Charges // nil: no POST /charges
	)
	if set.processorURL != "" {
		jobs, ops, stopJobs, err := startSettlement(ctx, pool, keys, set, log)
		if err != nil {
			closeAll()
			return err
		}
		// Deferred first, so it runs after the server has shut down: no
		// request inserts a job any more.
		defer func() { err = errors.Join(err, stopJobs()) }()
		settler, charges = jobs, ops
	}
	if set.natsURL != "" {
		consumerObs, err := newConsumerMetrics(mp, obs)
		if err != nil {
			closeAll()
			return err
		}
		stopDeposits, err := startDeposits(ctx, set.natsURL, keys, consumerObs, log)
		if err != nil {
			closeAll()
			return err
		}
		defer func() { err = errors.Join(err, stopDeposits()) }()
	}
	handler, err := payments.NewHandler(pool, keys, &payments.Config{
		Settler:      settler,
		Charges:      charges,
		Logger:       log,
		PaymentRate:  set.paymentRate,
		PaymentBurst: set.paymentBurst,
	})
	if err != nil {
		closeAll()
		return err
	}
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: set.readHeaderTimeout,
			ReadTimeout:       set.readTimeout,
			WriteTimeout:      set.writeTimeout,
			IdleTimeout:       set.idleTimeout,
			MaxHeaderBytes:    MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
	}
	srv := newServer(handler)
	internal := http.NewServeMux()
	internal.Handle("GET /metrics", metrics)
	metricsSrv := newServer(internal)

	// The sweeper lives as long as the server: it stops when ctx ends, and
	// serve does not return before it has.
	sweepCtx, stopSweeper := context.WithCancel(ctx)
	var sweeper sync.WaitGroup
	sweeper.Go(func() { _ = keys.SweepEvery(sweepCtx, set.sweepEvery, nil) })
	defer sweeper.Wait()
	defer stopSweeper()

	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	servers := []*http.Server{srv}
	metricsAt := ""
	if metricsLn != nil {
		go func() { served <- metricsSrv.Serve(metricsLn) }()
		servers = append(servers, metricsSrv)
		metricsAt = metricsLn.Addr().String()
	}
	log.Info("serving", "addr", ln.Addr().String(), "metrics_addr", metricsAt, "sweep_every", set.sweepEvery,
		"processor", set.processorURL, "payment_rate", float64(set.paymentRate), "payment_burst", set.paymentBurst,
		"charge_lease", set.chargeLease, "nats", set.natsURL)

	var failed error
	select {
	case failed = <-served:
	case <-ctx.Done():
		log.Info("shutting down")
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	var errs []error
	for _, s := range servers {
		if err := s.Shutdown(shutdownCtx); err != nil {
			// Requests still running after the grace period are cut off.
			_ = s.Close()
			errs = append(errs, err)
		}
	}
	if failed == nil {
		failed = <-served
	}
	for range len(servers) - 1 {
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	if !errors.Is(failed, http.ErrServerClosed) {
		errs = append(errs, failed)
	}
	return errors.Join(errs...)
}

// startSettlement starts the River client that settles payments at the
// processor at set.processorURL and completes the charges that their
// clients left, and returns the Settler that inserts its jobs, the
// charges of POST /charges (on keys), and a function that stops it: jobs
// in flight get shutdownTimeout to finish, and are then cancelled (River
// runs them again later).
func startSettlement(ctx context.Context, pool *pgxpool.Pool, keys *idem.Client, set settings, log *slog.Logger) (payments.Settler, *payments.Charges, func() error, error) {
	// The processor's calls are bounded by their contexts
	// (settlement.CallTimeout); a transport of its own keeps them apart
	// from any other traffic of the process.
	proc, err := processor.NewClient(set.processorURL, &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()})
	if err != nil {
		return nil, nil, nil, err
	}
	// River's workers, then its client, then the charges, whose OnStart
	// inserts with the client, then their completer, before Start.
	workers := river.NewWorkers()
	jobs, err := settlement.NewClient(pool, proc, log, workers)
	if err != nil {
		return nil, nil, nil, err
	}
	charges, err := payments.NewCharges(keys, proc, &payments.ChargesConfig{
		Lease: set.chargeLease,
		// Past the lease by half of it: for the clocks of the service and
		// the database, which differ a little, and a renewal in flight.
		OnStart: idemriver.OnStart(jobs, set.chargeLease+set.chargeLease/2),
	})
	if err != nil {
		return nil, nil, nil, err
	}
	completer, err := idemriver.NewWorker(charges)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := river.AddWorkerSafely(workers, completer); err != nil {
		return nil, nil, nil, err
	}
	// The jobs outlive the request that ends ctx; Stop ends them.
	if err := jobs.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, nil, nil, err
	}
	stop := func() error {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		if err := jobs.Stop(stopCtx); err != nil {
			return jobs.StopAndCancel(context.WithoutCancel(ctx))
		}
		return nil
	}
	return settlement.NewQueue(jobs), charges, stop, nil
}

// migrate creates the tables, deposits' and River's included, waiting for the database
// if it is not up yet: the service starts listening, and /healthz answers
// 200, only once it can serve.
func migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	for {
		err := payments.Migrate(ctx, pool)
		if err == nil {
			err = deposits.Migrate(ctx, pool)
		}
		if err == nil {
			err = settlement.Migrate(ctx, pool)
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, payments.ErrOldSchema) {
			return err // waiting does not change the tables
		}
		log.Warn("database not ready, retrying", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}
