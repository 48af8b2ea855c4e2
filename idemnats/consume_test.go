package idemnats_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/idemnats"
	"github.com/idemhq/idem/testkit/consumertest"
	"github.com/idemhq/idem/testkit/testdb"
)

// broker is a JetStream server embedded in the test process (the NATS
// project's own practice), with a stream EVENTS, a durable pull consumer
// on it whose ack wait is short (a killed instance's message comes back
// within it), and a stream DLQ that captures the dead letters.
type broker struct {
	url string
	nc  *nats.Conn
	js  jetstream.JetStream
}

const ackWait = 500 * time.Millisecond

func newBroker(t testing.TB) *broker {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the embedded NATS server did not start")
	}
	b := &broker{url: srv.ClientURL()}
	if b.nc, b.js, err = b.connect(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.nc.Close)
	ctx := t.Context()
	for name, subject := range map[string]string{"EVENTS": "events.>", "DLQ": "dlq.>"} {
		if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{
		Durable: "storm", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	}); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *broker) connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(b.url)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// Publish sets Idempotency-Key rather than Nats-Msg-Id: JetStream would
// drop the storm's second publishes itself within its duplicate window.
func (b *broker) Publish(ctx context.Context, id string, payload []byte) error {
	msg := &nats.Msg{Subject: "events.storm", Data: payload, Header: nats.Header{"Idempotency-Key": {id}}}
	_, err := b.js.PublishMsg(ctx, msg)
	return err
}

// Consume is one instance: a connection of its own, closed when ctx ends,
// as a killed process's would be.
func (b *broker) Consume(ctx context.Context, p idemconsume.Processor) error {
	nc, js, err := b.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	cons, err := js.Consumer(ctx, "EVENTS", "storm")
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	return idemnats.Consume(ctx, cons, p, &idemnats.Config{DeadLetterSubject: "dlq.storm", JetStream: js},
		jetstream.PullMaxMessages(10))
}

func (b *broker) DeadLetters(ctx context.Context) ([]string, error) {
	s, err := b.js.Stream(ctx, "DLQ")
	if err != nil {
		return nil, err
	}
	var out []string
	for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return nil, err
		}
		out = append(out, string(m.Data))
	}
	return out, nil
}

// TestStorm: producer retries, instances killed mid-handler and between
// COMMIT and the ack (their messages come back when the ack wait expires),
// each replaced, poison messages: with idem every message's effect commits
// once and exactly the poison ones are dead-lettered; the bare consumer's
// duplicates are shown beside it.
func TestStorm(t *testing.T) {
	t.Parallel()
	consumertest.Storm{}.Compare(t, "NATS JetStream", testdb.New(t), newStormBroker)
}

// TestStormLong is TestStorm at consumertest.Long's size.
func TestStormLong(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") == "" {
		t.Skip("IDEM_TEST_LONG=1 runs it")
	}
	consumertest.Long().Compare(t, "NATS JetStream", testdb.New(t), newStormBroker)
}

func newStormBroker(t testing.TB) consumertest.Broker { return newBroker(t) }

// TestStormProcesses is TestStorm with each consumer instance a process of
// its own, connected to the embedded server over TCP and killed with
// SIGKILL mid-handler and between COMMIT and the ack: the server sees the
// connection drop, and the dead instance's messages come back when the
// ack wait expires.
func TestStormProcesses(t *testing.T) {
	consumertest.Storm{}.CompareProcesses(t, "NATS JetStream", testdb.URL(t), func(t testing.TB) consumertest.Remote { return newBroker(t) })
}

// Endpoint is the server's URL, for an instance in another process
// (openEndpoint).
func (b *broker) Endpoint() string { return b.url }

// openEndpoint is the server that Endpoint names, to consume from in a
// consumer instance of a process storm.
func openEndpoint(url string) consumertest.ConsumeFunc { return (&broker{url: url}).Consume }

// TestNatsMsgIDIsTheKey: a message published with Nats-Msg-Id is keyed by
// it, so a second publish after JetStream's duplicate window is dropped
// by idem, and a handler slower than the ack wait runs once. The heartbeat
// (InProgress) keeps the slow message from being redelivered; on a
// machine slow enough to miss a beat, the redelivery finds the key in
// progress or done, and the effect is still made once.
func TestNatsMsgIDIsTheKey(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := t.Context()
	pool := testdb.New(t)
	if _, err := pool.Exec(ctx, consumertest.EffectsSQL); err != nil {
		t.Fatal(err)
	}
	// The stream forgets ids at once: every publish is stored.
	if _, err := b.js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Duplicates: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	done := make(chan idemconsume.Result, 4)
	c, err := idemconsume.New(pool, &idemconsume.Config{Name: "slow"}, func(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
		time.Sleep(2 * ackWait) // longer than the ack wait
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ('slow', $1)", string(m.Payload))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := b.js.Consumer(ctx, "EVENTS", "storm")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	exited := make(chan error)
	go func() {
		exited <- idemnats.Consume(runCtx, cons, reporting{c, done}, &idemnats.Config{})
	}()
	for range 2 {
		// The server forgets ids on a timer of its own, which a loaded
		// machine delays: publish until the stream stores the message.
		for {
			ack, err := b.js.Publish(ctx, "events.once", []byte("a"), jetstream.WithMsgID("order-17"))
			if err != nil {
				t.Fatal(err)
			}
			if !ack.Duplicate {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond) // past the duplicate window
	}
	var got []idem.Outcome
	executed, replayed := 0, 0
	for executed == 0 || replayed == 0 {
		select {
		case res := <-done:
			got = append(got, res.Outcome)
			switch res.Outcome {
			case idem.OutcomeExecuted:
				executed++
			case idem.OutcomeReplayed:
				replayed++
			case idem.OutcomeInProgress: // a redelivery while the first ran
			default:
				t.Fatalf("outcomes %v: want executed once, replayed for the second publish", got)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("outcomes so far %v", got)
		}
	}
	stop()
	if err := <-exited; err != nil {
		t.Fatal(err)
	}
	if executed != 1 {
		t.Fatalf("outcomes %v: the handler ran %d times; want once", got, executed)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d effects (%v), want 1", n, err)
	}
}

// reporting passes each result on.
type reporting struct {
	p    idemconsume.Processor
	done chan<- idemconsume.Result
}

func (r reporting) Process(ctx context.Context, m *idemconsume.Message, s idemconsume.Settler) (idemconsume.Result, error) {
	res, err := r.p.Process(ctx, m, s)
	if err == nil || !errors.Is(err, context.Canceled) {
		r.done <- res
	}
	return res, err
}
