package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/deposits"
	"github.com/idemhq/idem/payments_example/internal/payments"
)

// The deposits the demo publishes to the service's JetStream stream,
// alongside the payments, for an account of their own.
const (
	depositCount = 200
	// depositBatches is how many batches the deposits come in (a bank's
	// transfer files), batch k once k tenths of the payments are answered:
	// the kill halfway meets one in the service's hands.
	depositBatches = 10
	// depositRetried of the deposits are published a second time by their
	// producer, with the same Nats-Msg-Id, later than the stream's
	// duplicate window, as an outbox relay that restarted replays what it
	// had not marked as sent.
	depositRetried = 0.1
	// duplicateWindow is the stream's duplicate window: JetStream itself
	// drops a second publish with the same Nats-Msg-Id within it. Its
	// default is 2 minutes; a short one lets the demo publish later than
	// it without waiting that long.
	duplicateWindow = time.Second
	// inHandWait bounds how long the kill waits for deposits in the
	// service's hands.
	inHandWait = 3 * time.Second
)

// A deposit the demo's producer publishes, under its id, and whether it
// publishes it twice.
type deposit struct {
	id      string
	amount  int64
	retried bool
}

// makeDepositPlan returns the deposits to publish, drawn from the seed as
// the payments are.
func makeDepositPlan() []deposit {
	rng := rand.New(rand.NewPCG(seed, seed+2))
	var keySeed [32]byte
	binary.LittleEndian.PutUint64(keySeed[:], seed+2)
	keys := rand.NewChaCha8(keySeed)
	plan := make([]deposit, depositCount)
	for i := range plan {
		id, err := uuid.NewRandomFromReader(keys)
		if err != nil {
			panic(err) // ChaCha8 never fails to read
		}
		plan[i] = deposit{id: id.String(), amount: 100 + rng.Int64N(9_901), retried: rng.Float64() < depositRetried}
	}
	return plan
}

// startNATS starts a NATS server with JetStream in the demo's process,
// storing in dir, and returns its URL and a function that shuts it down:
// `make demo` needs no NATS installed.
func startNATS(dir string) (string, func(), error) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		return "", nil, err
	}
	srv.Start()
	stop := func() { srv.Shutdown(); srv.WaitForShutdown() }
	if !srv.ReadyForConnections(10 * time.Second) {
		stop()
		return "", nil, fmt.Errorf("the NATS server in %s did not start", filepath.Base(dir))
	}
	return srv.ClientURL(), stop, nil
}

// depositOutcome is what the deposits came to.
type depositOutcome struct {
	events      int // deposits in the plan
	published   int // publishes the stream stored: each deposit once, the retried ones twice
	republished int // of which second publishes
	inHand      int // delivered to the service, not acknowledged, when it was killed
	credits     int // ledger rows of the account
	duplicates  int // rows beyond one per deposit
	lost        int // deposits without a row
	expected    int64
	actual      int64
	draining    time.Duration // from the last publish until the stream had nothing pending

	// With idem: the restarted service's own count, from its metrics:
	// deliveries by result (deposits_messages_total) and redeliveries.
	counted      map[string]int64
	redeliveries int64
}

func (o depositOutcome) exact() bool {
	return o.duplicates == 0 && o.lost == 0 && o.credits == o.events && o.actual == o.expected &&
		o.published == o.events+o.republished && o.draining <= settleBound
}

// depositor is the producer of the deposits of one half of the demo, on
// a NATS server of that half's.
type depositor struct {
	plan     []deposit
	account  uuid.UUID
	nc       *nats.Conn
	js       jetstream.JetStream
	o        depositOutcome
	lastSent time.Time
}

// newDepositor connects to the NATS server at url and makes the stream,
// as its operator would, with a short duplicate window; the service makes
// its consumer.
func newDepositor(ctx context.Context, url string, plan []deposit) (*depositor, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err == nil {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: deposits.StreamName, Subjects: []string{deposits.Subject},
			Duplicates: duplicateWindow})
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &depositor{plan: plan, nc: nc, js: js, o: depositOutcome{events: len(plan), expected: payments.OpeningBalance}}, nil
}

func (d *depositor) close() { d.nc.Close() }

// openAccount signs up the account the deposits are for.
func (d *depositor) openAccount(ctx context.Context, signUp *api.ClientWithResponses) error {
	created, err := signUp.CreateAccountWithResponse(ctx, api.CreateAccountJSONRequestBody{Owner: "demo deposits"})
	if err != nil {
		return err
	}
	if created.JSON201 == nil {
		return fmt.Errorf("sign-up: status %d", created.StatusCode())
	}
	d.account = created.JSON201.Id
	return nil
}

// publishAll publishes the plan in depositBatches batches, batch k once
// paid of the payments' total are answered in proportion, and publishes
// the retried deposits a second time once the duplicate window has passed
// since their first publish (the last ones after the last batch).
func (d *depositor) publishAll(ctx context.Context, paid *atomic.Int64, total int) error {
	type retry struct {
		i   int
		due time.Time
	}
	var retries []retry
	republish := func(all bool) error {
		for len(retries) > 0 && (all || time.Now().After(retries[0].due)) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(retries[0].due)):
			}
			if err := d.publish(ctx, d.plan[retries[0].i], true); err != nil {
				return err
			}
			retries = retries[1:]
		}
		return nil
	}
	n := len(d.plan)
	for k := range depositBatches {
		for paid.Load() < int64(k*total/depositBatches) && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		if err := republish(false); err != nil {
			return err
		}
		for i := k * n / depositBatches; i < (k+1)*n/depositBatches; i++ {
			if err := d.publish(ctx, d.plan[i], false); err != nil {
				return err
			}
			if d.plan[i].retried {
				// A little past the window: the server forgets ids on a timer.
				retries = append(retries, retry{i, time.Now().Add(duplicateWindow + duplicateWindow/4)})
			}
		}
	}
	return republish(true)
}

// publish publishes dep under its id and checks that the stream stored
// it: a first publish must be new, and a second one is published again
// until the server has forgotten the id (its duplicate window's timer).
func (d *depositor) publish(ctx context.Context, dep deposit, again bool) error {
	body, err := json.Marshal(deposits.Deposit{AccountID: d.account, Amount: dep.amount, Currency: payments.Currency})
	if err != nil {
		return err
	}
	for {
		ack, err := d.js.Publish(ctx, deposits.Subject, body, jetstream.WithMsgID(dep.id))
		if err != nil {
			return fmt.Errorf("publish deposit %s: %w", dep.id, err)
		}
		d.lastSent = time.Now()
		switch {
		case !ack.Duplicate:
			d.o.published++
			if again {
				d.o.republished++
			}
			return nil
		case !again:
			return fmt.Errorf("publish deposit %s: the stream took its first publish for a duplicate", dep.id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(duplicateWindow / 10):
		}
	}
}

// info returns the service's consumer's state.
func (d *depositor) info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	cons, err := d.js.Consumer(ctx, deposits.StreamName, deposits.ConsumerName)
	if err != nil {
		return nil, err
	}
	return cons.Info(ctx)
}

// holdAtKill, set by TestPlay, makes the kill certain to meet deposits in
// the service's hands (a test hook). Without it, the service may credit
// and acknowledge those waitInHand saw before the kill lands, or none may
// arrive within inHandWait, and the kill meets none. With it, the kill
// holds the deposits' account row locked (hold) from before it waits until
// the service is dead, and waits until a credit of the service waits on
// the lock: that deposit cannot be acknowledged before the kill. The wait
// is bounded by settleBound: the payments go on meanwhile, and each tenth
// of them brings a batch of deposits.
var holdAtKill bool

// hold locks the row of the deposits' account in a transaction on pool,
// so that no credit to it commits. It returns whether a credit waits on
// the lock, and what rolls the transaction back (once, however often it
// is called). The killed service's credit that waited on the lock never
// commits: its client is gone before COMMIT.
func (d *depositor) hold(ctx context.Context, pool *pgxpool.Pool) (blocking func(context.Context) (bool, error), release func(), err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	var pid int32
	if err := tx.QueryRow(ctx, "select pg_backend_pid() from accounts where id = $1 for update", d.account).Scan(&pid); err != nil {
		_ = tx.Rollback(ctx)
		return nil, nil, err
	}
	blocking = func(ctx context.Context) (bool, error) {
		var b bool
		err := pool.QueryRow(ctx, "select exists (select from pg_locks where not granted and $1 = any(pg_blocking_pids(pid)))", pid).Scan(&b)
		return b, err
	}
	return blocking, sync.OnceFunc(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }), nil
}

// waitInHand waits until the service holds deposits it has not
// acknowledged, so that the kill meets some: without a hold (blocking
// nil), up to inHandWait, until the consumer has some delivered and not
// acknowledged; with one, up to settleBound, until a credit waits on it.
func (d *depositor) waitInHand(ctx context.Context, blocking func(context.Context) (bool, error)) error {
	wait := inHandWait
	if blocking != nil {
		wait = settleBound
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		var inHand bool
		var err error
		if blocking != nil {
			inHand, err = blocking(ctx)
		} else {
			var info *jetstream.ConsumerInfo
			if info, err = d.info(ctx); err == nil {
				inHand = info.NumAckPending > 0
			}
		}
		if err != nil {
			return err
		}
		if inHand {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// killed records what the killed service held: the deposits delivered to
// it that it had not acknowledged, which the server delivers again once
// deposits.AckWait has passed.
func (d *depositor) killed(ctx context.Context) error {
	info, err := d.info(ctx)
	if err != nil {
		return err
	}
	d.o.inHand = info.NumAckPending
	return nil
}

// drain waits until the service's consumer has nothing pending, neither
// undelivered nor unacknowledged, or until settleBound after the last
// publish, and records how long after it that was.
func (d *depositor) drain(ctx context.Context) error {
	for {
		info, err := d.info(ctx)
		if err != nil {
			return err
		}
		d.o.draining = time.Since(d.lastSent)
		if info.NumPending == 0 && info.NumAckPending == 0 || d.o.draining > settleBound {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// measure counts the credits of each deposit in the ledger and reads the
// account's balance; drain has returned.
func (d *depositor) measure(ctx context.Context, pool *pgxpool.Pool) (depositOutcome, error) {
	o := d.o
	rows, err := pool.Query(ctx, `select event_id, count(*) from deposits where account_id = $1 group by event_id`, d.account)
	if err != nil {
		return o, err
	}
	credited := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return o, err
		}
		credited[id] = n
		o.credits += n
	}
	if err := rows.Err(); err != nil {
		return o, err
	}
	for _, dep := range d.plan {
		o.expected += dep.amount
		if credited[dep.id] == 0 {
			o.lost++
		}
	}
	o.duplicates = o.credits - (o.events - o.lost)
	if err := pool.QueryRow(ctx, `select balance from accounts where id = $1`, d.account).Scan(&o.actual); err != nil {
		return o, err
	}
	return o, nil
}

// reportDeposits prints what the deposits came to, with idem and without.
func reportDeposits(out io.Writer, with, without depositOutcome) {
	fmt.Fprintf(out, "\nThe deposits (a JetStream stream the service consumes, idemnats and idemconsume\n"+
		"with idem; without it, a plain transaction per delivery, acknowledged after COMMIT):\n")
	row := func(name string, a, b any) { fmt.Fprintf(out, "  %-28s %16v %16v\n", name, a, b) }
	row("", "with idem", "without idem")
	row("deposits", with.events, without.events)
	row("publishes stored", with.published, without.published)
	row("published again, later", with.republished, without.republished)
	row("in hand at the kill", with.inHand, without.inHand)
	row("credits committed", with.credits, without.credits)
	row("duplicate credits", with.duplicates, without.duplicates)
	row("deposits lost", with.lost, without.lost)
	row("expected balance", usd(with.expected), usd(without.expected))
	row("actual balance", usd(with.actual), usd(without.actual))
	row("overcredited", usd(with.actual-with.expected), usd(without.actual-without.expected))
	row("credited after last publish", fmt.Sprintf("%.1f s", with.draining.Seconds()), fmt.Sprintf("%.1f s", without.draining.Seconds()))
	fmt.Fprintln(out)
	if with.exact() {
		fmt.Fprintf(out, "With idem: each deposit was credited exactly once, none lost, through the\n"+
			"kill (%d deposits in hand came back) and %d second publishes.\n", with.inHand, with.republished)
	} else {
		fmt.Fprintf(out, "With idem: deposits NOT EXACT.\n")
	}
	fmt.Fprintf(out, "Without idem: %d second publishes and %d redeliveries became %d extra credits;\n"+
		"%s was credited twice.\n", without.republished, without.inHand, without.duplicates, usd(without.actual-without.expected))
}

// retriedCount counts the deposits of plan published twice.
func retriedCount(plan []deposit) int {
	n := 0
	for _, d := range plan {
		if d.retried {
			n++
		}
	}
	return n
}
