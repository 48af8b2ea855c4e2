package idemkafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/idemkafka"
	"github.com/idemhq/idem/testkit/consumertest"
	"github.com/idemhq/idem/testkit/testdb"
)

// broker is a kfake cluster (in-process, speaking the Kafka protocol) with
// a topic of 4 partitions and its dead-letter topic, for one storm.
type broker struct {
	addrs    []string
	topic    string
	producer *kgo.Client
	// session is the group session timeout of its consumers, and their
	// rebalance timeout is 5 times as long; 0: franz-go's defaults (45s,
	// 60s). A member that dies without leaving (SIGKILL) holds its
	// partitions until its session expires.
	session time.Duration
	// batch is the consumers' Config.Batch.
	batch int

	mu   sync.Mutex
	dead []string
}

func newBroker(t testing.TB, topic string) *broker {
	t.Helper()
	// kfake refuses sessions shorter than 6s unless told otherwise; a
	// process storm's consumers ask for processSession.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic, topic+".dlq"),
		kfake.GroupMinSessionTimeout(processSession))
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
	opts := []kgo.Opt{kgo.SeedBrokers(b.addrs...),
		kgo.ConsumerGroup(b.topic + "-group"), kgo.ConsumeTopics(b.topic),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50 * time.Millisecond), kgo.HeartbeatInterval(100 * time.Millisecond)}
	if b.session > 0 {
		// A rebalance waits for every member to rejoin, or leave, or for
		// the rebalance timeout: a member that stops while a rebalance
		// is under way leaves only once it has ended.
		opts = append(opts, kgo.SessionTimeout(b.session), kgo.RebalanceTimeout(5*b.session))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	return idemkafka.Consume(ctx, cl, p, &idemkafka.Config{DeadLetterTopic: b.topic + ".dlq", MaxPollRecords: 20, Batch: b.batch})
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

// TestStormBatch is TestStorm's idem row with Config.Batch: each
// partition's records of a poll in transactions of up to 8, the storm's
// kills and terminations landing in the middle of batches.
func TestStormBatch(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	c, _ := consumertest.Processors(t, pool)
	b := newBroker(t, fmt.Sprintf("events-%d", rand.Int64()))
	b.batch = 8
	s := consumertest.Storm{}
	row := s.Run(t, "batch", b, pool, c)
	t.Log("kafka (kfake) storm, batches of 8:" + consumertest.Table(row))
	if !row.Exact(3) { // Storm's default Poison
		t.Errorf("%+v; want no duplicate, none lost, exactly the poison messages dead-lettered", row)
	}
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

// TestStormProcesses is TestStorm with each consumer instance a process of
// its own, killed with SIGKILL mid-handler and between COMMIT and the
// offset commit: a dead member leaves the group only when its session
// expires, and its replacement's join rebalances the group again. Each
// kill holds the dead member's partitions for the session timeout, which
// makes this storm take about half a minute: make test-long runs it.
func TestStormProcesses(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") == "" {
		t.Skip("IDEM_TEST_LONG=1 runs it")
	}
	consumertest.Storm{}.CompareProcesses(t, "kafka (kfake)", testdb.URL(t), func(t testing.TB) consumertest.Remote {
		return newBroker(t, fmt.Sprintf("events-%d", rand.Int64()))
	})
}

// processSession is the session timeout of a process storm's consumers:
// short, since each SIGKILL holds the dead member's partitions that long.
const processSession = time.Second

// Endpoint is the cluster's address and the topic, for an instance in
// another process (openEndpoint).
func (b *broker) Endpoint() string { return strings.Join(b.addrs, ",") + " " + b.topic }

// openEndpoint is the broker that Endpoint names, to consume from in a
// consumer instance of a process storm.
func openEndpoint(endpoint string) consumertest.ConsumeFunc {
	addrs, topic, _ := strings.Cut(endpoint, " ")
	return (&broker{addrs: strings.Split(addrs, ","), topic: topic, session: processSession}).Consume
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
	// Batches need a processor that makes them.
	cl, err := kgo.NewClient(append(base, kgo.ConsumerGroup("g"), kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll())...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, bare := consumertest.Processors(t, testdb.New(t))
	if err := idemkafka.Consume(t.Context(), cl, bare, &idemkafka.Config{DeadLetterTopic: "dlq", Batch: 10}); err == nil {
		t.Error("Consume accepted Config.Batch with a processor that cannot batch")
	}
}
