// Command demo shows, in a few seconds, what idem guarantees.
//
// It starts the payments service, signs up for an account and its API
// key, puts a proxy in front of the service that loses 30% of the answers
// after the service has acted, and sends 300 payments through it. The
// client is the one generated from the service's OpenAPI spec (package
// api), over a go-retryablehttp client that retries every failure with the
// payment's Idempotency-Key: spec, server and client, exactly once. Then it checks the account: with idem, the balance is
// exact. It then sends the same traffic to the same business code without
// idem, and shows how much money the retries charged twice.
//
// Run it with `make demo` or `go run ./payments_example/demo`. It finds
// PostgreSQL as the tests do (IDEM_TEST_DATABASE_URL, DATABASE_URL, else
// 127.0.0.1:5432), works in a database of its own that it drops at the end,
// and exits non-zero if the protected balance is not exact.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/payments"
)

const (
	paymentCount   = 300
	workers        = 8
	lossRate       = 0.30
	seed           = 2026       // fixes the keys, the amounts and which answers are lost
	openingBalance = 100_000_00 // cents: 100,000.00 USD, enough for every charge twice over
	timeLimit      = 50 * time.Second
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeLimit)
	defer cancel()

	exact, err := run(ctx, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	if !exact {
		os.Exit(1)
	}
}

// run plays both halves of the demo and reports whether the protected
// balance came out exact.
func run(ctx context.Context, out io.Writer) (bool, error) {
	pool, cleanup, err := freshDatabase(ctx, serverURL())
	if err != nil {
		return false, err
	}
	defer cleanup()
	if err := payments.Migrate(ctx, pool); err != nil {
		return false, err
	}

	plan := makePlan()
	fmt.Fprintf(out, "Sending %d payments (%d workers) through a network that loses %.0f%% of the\n"+
		"answers after the service has acted. Every failure is retried with the same key.\n\n",
		paymentCount, workers, lossRate*100)

	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		return false, err
	}
	protected, err := payments.NewHandler(pool, keys, nil, nil)
	if err != nil {
		return false, err
	}
	with, err := play(ctx, pool, protected, plan)
	if err != nil {
		return false, fmt.Errorf("with idem: %w", err)
	}
	without, err := play(ctx, pool, payments.NewUnprotectedHandler(pool, nil, nil), plan)
	if err != nil {
		return false, fmt.Errorf("without idem: %w", err)
	}
	report(out, with, without)
	return with.exact(), nil
}

// makePlan returns the payments to send. A real client calls uuid.New()
// for each key; the demo draws its keys and amounts from the seed so that
// every run prints the same numbers.
func makePlan() []payment {
	rng := rand.New(rand.NewPCG(seed, seed))
	var keySeed [32]byte
	binary.LittleEndian.PutUint64(keySeed[:], seed)
	keys := rand.NewChaCha8(keySeed)
	plan := make([]payment, paymentCount)
	for i := range plan {
		key, err := uuid.NewRandomFromReader(keys)
		if err != nil {
			panic(err) // ChaCha8 never fails to read
		}
		plan[i] = payment{key: key.String(), amount: 100 + rng.Int64N(9_901)} // 1.00 to 100.00 USD
	}
	return plan
}

// outcome is what one half of the demo measured.
type outcome struct {
	sent     int
	failed   []error // payments never answered 201
	lost     int64   // answers the proxy dropped
	retries  int64   // requests the client sent again
	replays  int64   // answers served from a stored result
	charges  int     // payment rows committed
	expected int64   // opening balance minus the payments answered 201
	actual   int64   // the balance the service reports
}

func (o outcome) duplicates() int { return o.charges - (o.sent - len(o.failed)) }

func (o outcome) exact() bool {
	return len(o.failed) == 0 && o.duplicates() == 0 && o.actual == o.expected
}

// play serves h behind a lossy proxy, opens an account and sends the plan
// through the proxy.
func play(ctx context.Context, pool *pgxpool.Pool, h http.Handler, plan []payment) (outcome, error) {
	service, stopService, err := serve(ctx, h)
	if err != nil {
		return outcome{}, err
	}
	defer stopService()
	proxy := newLossyProxy(service, seed, lossRate)
	proxyURL, stopProxy, err := serve(ctx, proxy)
	if err != nil {
		return outcome{}, err
	}
	defer stopProxy()

	// The account is opened directly: the experiment is the payments.
	direct := &http.Client{Timeout: 10 * time.Second}
	signUp, err := newAPIClient(service, "", direct)
	if err != nil {
		return outcome{}, err
	}
	created, err := signUp.CreateAccountWithResponse(ctx, api.CreateAccountJSONRequestBody{Owner: "demo", Balance: openingBalance})
	if err != nil {
		return outcome{}, err
	}
	if created.JSON201 == nil {
		return outcome{}, fmt.Errorf("sign-up: status %d", created.StatusCode())
	}
	account, apiKey := created.JSON201.Id, created.JSON201.ApiKey

	var retries atomic.Int64
	payer, err := newAPIClient(proxyURL, apiKey, newRetryingClient(&retries).StandardClient())
	if err != nil {
		return outcome{}, err
	}
	errs := payAll(ctx, payer, account, plan, workers)
	if err := ctx.Err(); err != nil {
		return outcome{}, err
	}

	o := outcome{sent: len(plan), expected: openingBalance}
	for i, err := range errs {
		if err != nil {
			o.failed = append(o.failed, err)
		} else {
			o.expected -= plan[i].amount
		}
	}
	o.lost, o.retries, o.replays = proxy.lost.Load(), retries.Load(), proxy.replays.Load()

	owner, err := newAPIClient(service, apiKey, direct)
	if err != nil {
		return outcome{}, err
	}
	got, err := owner.GetAccountWithResponse(ctx, account)
	if err != nil {
		return outcome{}, err
	}
	if got.JSON200 == nil {
		return outcome{}, fmt.Errorf("read the account: status %d", got.StatusCode())
	}
	o.actual = got.JSON200.Balance
	err = pool.QueryRow(ctx, "select count(*) from payments where account_id = $1", account).Scan(&o.charges)
	return o, err
}

func report(out io.Writer, with, without outcome) {
	row := func(name string, a, b any) { fmt.Fprintf(out, "  %-22s %16v %16v\n", name, a, b) }
	row("", "with idem", "without idem")
	row("payments sent", with.sent, without.sent)
	row("answers lost", with.lost, without.lost)
	row("retries", with.retries, without.retries)
	row("replays served", with.replays, without.replays)
	row("charges committed", with.charges, without.charges)
	row("duplicate charges", with.duplicates(), without.duplicates())
	row("expected balance", usd(with.expected), usd(without.expected))
	row("actual balance", usd(with.actual), usd(without.actual))
	row("overcharged", usd(with.expected-with.actual), usd(without.expected-without.actual))
	fmt.Fprintln(out)

	if with.exact() {
		fmt.Fprintf(out, "With idem: every retry was answered from the stored result; each payment was\n"+
			"charged exactly once, and the balance is exact.\n")
	} else {
		fmt.Fprintf(out, "With idem: THE BALANCE IS NOT EXACT (%d payments failed: %v).\n", len(with.failed), errors.Join(with.failed...))
	}
	fmt.Fprintf(out, "Without idem: %d retries became %d extra charges; %s was taken twice.\n",
		without.retries, without.duplicates(), usd(without.expected-without.actual))
}

// usd formats cents as "1,234.56 USD".
func usd(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	whole := fmt.Sprint(cents / 100)
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "," + whole[i:]
	}
	return fmt.Sprintf("%s%s.%02d USD", sign, whole, cents%100)
}
