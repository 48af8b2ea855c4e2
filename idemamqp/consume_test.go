package idemamqp_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemhq/idem/idemamqp"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/testkit/consumertest"
	"github.com/idemhq/idem/testkit/testdb"
)

// brokerURL is the RabbitMQ the tests use: IDEM_TEST_AMQP_URL, else the
// local server (make brokers starts or installs it). A test fails, never
// skips, when neither answers.
func brokerURL() string {
	if u := os.Getenv("IDEM_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// broker is a quorum queue (it counts deliveries in x-delivery-count) of
// its own on the real RabbitMQ, a dead-letter exchange and its queue.
type broker struct {
	queue string
	pub   *amqp.Connection
	pubCh *amqp.Channel

	mu   sync.Mutex
	dead []string
}

func dial(t testing.TB) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, ch, err := connect()
	if err != nil {
		t.Fatal(err)
	}
	return conn, ch
}

// connect opens a connection and a channel on it.
func connect() (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		return nil, nil, fmt.Errorf("RabbitMQ at %s: %w (make brokers starts or installs one; IDEM_TEST_AMQP_URL names another)", brokerURL(), err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

func newBroker(t testing.TB) *broker {
	t.Helper()
	b := &broker{queue: fmt.Sprintf("idem-test-%d-%d", os.Getpid(), rand.Int64())}
	b.pub, b.pubCh = dial(t)
	ch := b.pubCh
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	must(err)
	must(ch.ExchangeDeclare(b.queue+".dlx", "fanout", false, true, false, false, nil))
	_, err = ch.QueueDeclare(b.queue+".dlq", false, false, false, false, nil)
	must(err)
	must(ch.QueueBind(b.queue+".dlq", "", b.queue+".dlx", false, nil))
	must(ch.Confirm(false))
	t.Cleanup(func() {
		for _, q := range []string{b.queue, b.queue + ".dlq"} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = ch.ExchangeDelete(b.queue+".dlx", false, false)
		b.pub.Close()
	})
	return b
}

func (b *broker) Publish(ctx context.Context, id string, payload []byte) error {
	dc, err := b.pubCh.PublishWithDeferredConfirmWithContext(ctx, "", b.queue, false, false,
		amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: payload})
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err == nil && !ok {
		err = errors.New("the broker refused the publish (a nack)")
	}
	return err
}

// Consume is one instance: a connection of its own, closed when ctx ends,
// as a killed process's would be (the broker requeues what it held).
func (b *broker) Consume(ctx context.Context, p idemconsume.Processor) error {
	conn, ch, err := connect()
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := ch.Qos(10, 0, false); err != nil {
		return err
	}
	return idemamqp.Consume(ctx, ch, b.queue, p, &idemamqp.Config{DeadLetterExchange: b.queue + ".dlx"})
}

func (b *broker) DeadLetters(context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		d, ok, err := b.pubCh.Get(b.queue+".dlq", true)
		if err != nil {
			return nil, err
		}
		if !ok {
			return append([]string(nil), b.dead...), nil
		}
		b.dead = append(b.dead, string(d.Body))
	}
}

// TestStorm: producer retries, instances killed mid-handler and between
// COMMIT and the ack (the broker requeues what their connection held),
// each replaced, poison messages: with idem every message's effect commits
// once and exactly the poison ones are dead-lettered; the bare consumer's
// duplicates are shown beside it.
func TestStorm(t *testing.T) {
	t.Parallel()
	consumertest.Storm{}.Compare(t, "RabbitMQ", testdb.New(t), newStormBroker)
}

// TestStormLong is TestStorm at consumertest.Long's size.
func TestStormLong(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") == "" {
		t.Skip("IDEM_TEST_LONG=1 runs it")
	}
	consumertest.Long().Compare(t, "RabbitMQ", testdb.New(t), newStormBroker)
}

func newStormBroker(t testing.TB) consumertest.Broker { return newBroker(t) }

// TestStormProcesses is TestStorm with each consumer instance a process of
// its own, killed with SIGKILL mid-handler and between COMMIT and the ack:
// the broker sees the connection drop and requeues what it held.
func TestStormProcesses(t *testing.T) {
	consumertest.Storm{}.CompareProcesses(t, "RabbitMQ", testdb.URL(t), func(t testing.TB) consumertest.Remote { return newBroker(t) })
}

// Endpoint is the queue, for an instance in another process
// (openEndpoint), which reaches the same RabbitMQ (brokerURL).
func (b *broker) Endpoint() string { return b.queue }

// openEndpoint is the queue that Endpoint names, to consume from in a
// consumer instance of a process storm.
func openEndpoint(queue string) consumertest.ConsumeFunc { return (&broker{queue: queue}).Consume }
