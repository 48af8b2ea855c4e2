package deposits_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/payments_example/internal/deposits"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/testkit/testdb"
)

// liveness bounds the wait for the consumer: not a timing assertion, only
// a limit on a broken run.
const liveness = 60 * time.Second

// window is the test stream's duplicate window, JetStream's shortest.
const window = 100 * time.Millisecond

// rig is an account in a database of its own, and a JetStream server
// embedded in the test process with the deposits' stream on it.
type rig struct {
	pool    *pgxpool.Pool
	account uuid.UUID
	js      jetstream.JetStream
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ctx := t.Context()
	r := &rig{pool: testdb.New(t), account: uuid.New()}
	if err := payments.Migrate(ctx, r.pool); err != nil {
		t.Fatal(err)
	}
	if err := deposits.Migrate(ctx, r.pool); err != nil {
		t.Fatal(err)
	}
	apiKey := sha256.Sum256(r.account[:])
	if _, err := r.pool.Exec(ctx, `INSERT INTO accounts (id, owner, balance, api_key_sha256) VALUES ($1, 'test', $2, $3)`,
		r.account, payments.OpeningBalance, apiKey[:]); err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the embedded NATS server did not start")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if r.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: deposits.StreamName,
		Subjects: []string{deposits.Subject}, Duplicates: window}); err != nil {
		t.Fatal(err)
	}
	return r
}

// publish publishes body under id and fails the test unless the stream
// stored it: a second publish waits out the duplicate window first.
func (r *rig) publish(t *testing.T, id string, body []byte) {
	t.Helper()
	for range 100 {
		ack, err := r.js.Publish(t.Context(), deposits.Subject, body, jetstream.WithMsgID(id))
		if err != nil {
			t.Fatal(err)
		}
		if !ack.Duplicate {
			return
		}
		time.Sleep(window)
	}
	t.Fatalf("the stream kept dropping the publish of %s as a duplicate", id)
}

// consume runs run on the deposits' consumer (Subscribe's) until every
// message is settled, then stops it.
func (r *rig) consume(t *testing.T, run func(ctx context.Context, cons jetstream.Consumer) error) {
	t.Helper()
	cons, err := deposits.Subscribe(t.Context(), r.js)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = run(ctx, cons) })
	deadline := time.Now().Add(liveness)
	for {
		info, err := cons.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the consumer still has %d messages to deliver and %d unacknowledged", info.NumPending, info.NumAckPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if runErr != nil {
		t.Fatal(runErr)
	}
}

// credits returns the ledger's rows per event id, and the balance.
func (r *rig) credits(t *testing.T) (map[string]int, int64) {
	t.Helper()
	rows, err := r.pool.Query(t.Context(), `SELECT event_id, count(*) FROM deposits WHERE account_id = $1 GROUP BY event_id`, r.account)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for rows.Next() {
		var id string
		var c int
		if err := rows.Scan(&id, &c); err != nil {
			t.Fatal(err)
		}
		n[id] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var balance int64
	if err := r.pool.QueryRow(t.Context(), `SELECT balance FROM accounts WHERE id = $1`, r.account).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	return n, balance
}

// play publishes a deposit twice (the second time after the stream's
// duplicate window, so that JetStream stores both), a malformed event and
// a deposit for an account that does not exist, and consumes them with
// run.
func play(t *testing.T, run func(r *rig) func(ctx context.Context, cons jetstream.Consumer) error) (*rig, map[string]int, int64) {
	t.Helper()
	r := newRig(t)
	body := func(d deposits.Deposit) []byte {
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	r.publish(t, "deposit-1", body(deposits.Deposit{AccountID: r.account, Amount: 2500, Currency: payments.Currency}))
	r.publish(t, "malformed", []byte(`{"account_id": 7}`))
	r.publish(t, "nobody's", body(deposits.Deposit{AccountID: uuid.New(), Amount: 100, Currency: payments.Currency}))
	r.publish(t, "deposit-1", body(deposits.Deposit{AccountID: r.account, Amount: 2500, Currency: payments.Currency}))
	r.consume(t, run(r))
	credits, balance := r.credits(t)
	return r, credits, balance
}

// TestConsume: a deposit published twice is credited once, the second
// publish dropped as a duplicate by its key; the events that can never be
// credited are refused (their refusals stored with their keys) and
// acknowledged.
func TestConsume(t *testing.T) {
	t.Parallel()
	var counters idemconsume.Counters
	_, credits, balance := play(t, func(r *rig) func(ctx context.Context, cons jetstream.Consumer) error {
		return func(ctx context.Context, cons jetstream.Consumer) error {
			keys, err := idem.NewClient(r.pool, nil)
			if err != nil {
				return err
			}
			return deposits.Consume(ctx, cons, keys, &counters)
		}
	})
	if len(credits) != 1 || credits["deposit-1"] != 1 {
		t.Errorf("credits per event: %v, want deposit-1 once", credits)
	}
	if want := int64(payments.OpeningBalance + 2500); balance != want {
		t.Errorf("balance %d, want %d", balance, want)
	}
	got := counters.Get(deposits.ConsumerName)
	if got.Processed != 1 || got.Duplicates != 1 || got.Refused != 2 || got.DeadLettered != 0 {
		t.Errorf("the consumer counted %+v; want 1 processed, 1 duplicate, 2 refused (the malformed event, the unknown account)", got)
	}
}

// TestConsumeUnprotected: without idem, the same deposit published twice
// is credited twice; the events that can never be credited are
// terminated.
func TestConsumeUnprotected(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, credits, balance := play(t, func(r *rig) func(ctx context.Context, cons jetstream.Consumer) error {
		return func(ctx context.Context, cons jetstream.Consumer) error {
			return deposits.ConsumeUnprotected(ctx, cons, r.pool, log)
		}
	})
	if len(credits) != 1 || credits["deposit-1"] != 2 {
		t.Errorf("credits per event: %v, want deposit-1 twice", credits)
	}
	if want := int64(payments.OpeningBalance + 2*2500); balance != want {
		t.Errorf("balance %d, want %d", balance, want)
	}
}
