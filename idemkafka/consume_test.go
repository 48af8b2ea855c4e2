package idemkafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/idemkafka"
	"github.com/idemhq/idem/internal/consumertest"
	"github.com/idemhq/idem/internal/testdb"
)

// broker is a kfake cluster (in-process, speaking the Kafka protocol) with
// a topic of 4 partitions and its dead-letter topic, for one storm.
type broker struct {
	addrs    []string
	topic    string
	producer *kgo.Client

	mu   sync.Mutex
	dead []string
}

func newBroker(t testing.TB, topic string) *broker {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic, topic+".dlq"))
	if err != nil {
		t.Fatal(err)
	}
	b := &broker{addrs: c.ListenAddrs(), topic: topic}
	b.producer, err = kgo.NewClient(kgo.SeedBrokers(b.addrs...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	// The dead letters, read as they come.
	dlq, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...), kgo.ConsumeTopics(topic+".dlq"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			dlq.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				b.mu.Lock()
				b.dead = append(b.dead, string(r.Value))
				b.mu.Unlock()
			})
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		dlq.Close()
		b.producer.Close()
		c.Close()
	})
	return b
}

func (b *broker) Publish(ctx context.Context, id string, payload []byte) error {
	r := &kgo.Record{Value: payload, Headers: []kgo.RecordHeader{{Key: "Idempotency-Key", Value: []byte(id)}}}
	return b.producer.ProduceSync(ctx, r).FirstErr()
}

func (b *broker) Consume(ctx context.Context, p idemconsume.Processor) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...),
		kgo.ConsumerGroup(b.topic+"-group"), kgo.ConsumeTopics(b.topic),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond), kgo.HeartbeatInterval(100*time.Millisecond))
	if err != nil {
		return err
	}
	return idemkafka.Consume(ctx, cl, p, &idemkafka.Config{DeadLetterTopic: b.topic + ".dlq", MaxPollRecords: 20})
}

func (b *broker) DeadLetters(context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.dead...), nil
}

// TestStorm: producer retries, consumers killed mid-handler and between
// COMMIT and the offset commit, each replaced (a leave and a join, so the
// group rebalances), poison records: with idem every record's effect
// commits once and exactly the poison ones are dead-lettered; the bare
// consumer's duplicates are shown beside it.
func TestStorm(t *testing.T) {
	t.Parallel()
	consumertest.Storm{}.Compare(t, "kafka (kfake)", testdb.New(t), newStormBroker)
}

// TestStormLong is TestStorm at consumertest.Long's size.
func TestStormLong(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") == "" {
		t.Skip("IDEM_TEST_LONG=1 runs it")
	}
	consumertest.Long().Compare(t, "kafka (kfake)", testdb.New(t), newStormBroker)
}

// newStormBroker is a cluster of its own for each storm.
func newStormBroker(t testing.TB) consumertest.Broker {
	return newBroker(t, fmt.Sprintf("events-%d", rand.Int64()))
}

// TestConsumeChecksTheClient: a client that would commit offsets on its
// own, or let a partition move mid-record, is refused before any poll.
func TestConsumeChecksTheClient(t *testing.T) {
	t.Parallel()
	c, _ := consumertest.Processors(t, testdb.New(t))
	base := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumeTopics("t")}
	for name, opts := range map[string][]kgo.Opt{
		"no group":             {},
		"autocommit":           {kgo.ConsumerGroup("g"), kgo.BlockRebalanceOnPoll()},
		"rebalance mid-record": {kgo.ConsumerGroup("g"), kgo.DisableAutoCommit()},
	} {
		cl, err := kgo.NewClient(append(base, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := idemkafka.Consume(t.Context(), cl, c, &idemkafka.Config{DeadLetterTopic: "dlq"}); err == nil {
			t.Errorf("%s: Consume accepted the client", name)
		}
		cl.Close()
	}
}
