package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemhq/idem/idemconsume"
)

// Config is the adapter's settings.
type Config struct {
	// DeadLetterTopic receives the records dead-lettered. Required.
	DeadLetterTopic string
	// IDHeaders are the record headers that carry the producer's id, the
	// first present wins. Defaults to idemconsume.DefaultIDHeaders
	// (Idempotency-Key, then the CloudEvents id). The record's Kafka key
	// is not used: it names the entity the record is about, for
	// partitioning, not the event.
	IDHeaders []string
	// MaxPollRecords bounds the records processed between two commits.
	// Defaults to 500.
	MaxPollRecords int
}

// Consume consumes with cl until ctx ends, processing every record with p
// (usually an *idemconsume.Consumer), and returns nil then; or an error if
// cl or cfg is unfit, or cl was closed. cl must consume as a group member
// with kgo.DisableAutoCommit and kgo.BlockRebalanceOnPoll: Consume checks
// both. When ctx ends, Consume commits what was settled and closes cl,
// leaving the group.
func Consume(ctx context.Context, cl *kgo.Client, p idemconsume.Processor, cfg *Config) error {
	if err := check(cl, p, cfg); err != nil {
		return err
	}
	headers := cfg.IDHeaders
	if len(headers) == 0 {
		headers = idemconsume.DefaultIDHeaders()
	}
	maxPoll := cfg.MaxPollRecords
	if maxPoll <= 0 {
		maxPoll = 500
	}
	k := &consumer{cl: cl, p: p, dlq: cfg.DeadLetterTopic, headers: headers}
	defer cl.CloseAllowingRebalance()
	for {
		fetches := cl.PollRecords(ctx, maxPoll)
		if ctx.Err() != nil {
			// A poll cut short by ctx may still have returned records:
			// they were not processed, so nothing of them is committed.
			return nil
		}
		if fetches.IsClientClosed() {
			return errors.New("idemkafka: the client was closed")
		}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			settled []*kgo.Record
		)
		fetches.EachPartition(func(part kgo.FetchTopicPartition) {
			if len(part.Records) == 0 {
				return
			}
			wg.Go(func() {
				if last := k.partition(ctx, part.Records); last != nil {
					mu.Lock()
					settled = append(settled, last)
					mu.Unlock()
				}
			})
		})
		wg.Wait()
		if len(settled) > 0 {
			// Committed even when ctx ended: these records' transactions
			// answered, and committing them spares the next owner a replay.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err := cl.CommitRecords(cctx, settled...)
			cancel()
			if err != nil && ctx.Err() == nil {
				// Not fatal: the records are read again and replayed.
				cl.AllowRebalance()
				continue
			}
		}
		cl.AllowRebalance()
	}
}

func check(cl *kgo.Client, p idemconsume.Processor, cfg *Config) error {
	switch {
	case cl == nil || p == nil:
		return errors.New("idemkafka: Consume needs a client and a processor")
	case cfg == nil || cfg.DeadLetterTopic == "":
		return errors.New("idemkafka: Config.DeadLetterTopic is required")
	case cl.OptValue(kgo.ConsumerGroup) == "":
		return errors.New("idemkafka: the client must consume in a group (kgo.ConsumerGroup)")
	case cl.OptValue(kgo.DisableAutoCommit) != true:
		return errors.New("idemkafka: the client must not autocommit (kgo.DisableAutoCommit): an offset committed before the record's transaction answered loses the record")
	case cl.OptValue(kgo.BlockRebalanceOnPoll) != true:
		return errors.New("idemkafka: the client must block rebalances while records are processed (kgo.BlockRebalanceOnPoll)")
	}
	return nil
}

type consumer struct {
	cl      *kgo.Client
	p       idemconsume.Processor
	dlq     string
	headers []string
}

// partition processes one partition's records in order and returns the last
// one settled, or nil.
func (k *consumer) partition(ctx context.Context, recs []*kgo.Record) *kgo.Record {
	var last *kgo.Record
	for _, r := range recs {
		if !k.record(ctx, r) {
			break
		}
		last = r
	}
	return last
}

// record processes r until it is settled (acked or dead-lettered), and
// reports whether it was; false only when ctx ended first.
func (k *consumer) record(ctx context.Context, r *kgo.Record) bool {
	m := message(r, k.headers)
	for n := 1; ; n++ {
		m.Deliveries = n
		s := &settler{k: k, r: r}
		res, err := k.p.Process(ctx, m, s)
		switch {
		case ctx.Err() != nil:
			return err == nil && res.Action != idemconsume.Retry
		case err == nil && res.Action != idemconsume.Retry:
			return true
		case err != nil:
			// The dead letter could not be produced, or the processor
			// failed to settle: try the record again after a pause.
			res.Delay = time.Second
			n = max(n-1, 1)
		}
		t := time.NewTimer(res.Delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

func message(r *kgo.Record, names []string) *idemconsume.Message {
	h := make(map[string]string, len(r.Headers))
	for _, kv := range r.Headers {
		if _, ok := h[kv.Key]; !ok {
			h[kv.Key] = string(kv.Value)
		}
	}
	return &idemconsume.Message{
		ID:       idemconsume.ProducerID(func(k string) string { return h[k] }, names),
		Position: "kafka:" + source(r),
		Payload:  r.Value,
		Headers:  h,
	}
}

func source(r *kgo.Record) string {
	return r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
}

// settler: an Ack or a Retry needs nothing of the broker here (the offset
// is committed after the poll; a retry runs in place), a dead letter is
// produced before the offset may move past it.
type settler struct {
	k *consumer
	r *kgo.Record
}

func (s *settler) Ack(context.Context) error                  { return nil }
func (s *settler) Retry(context.Context, time.Duration) error { return nil }

func (s *settler) DeadLetter(ctx context.Context, reason error) error {
	dl := &kgo.Record{Topic: s.k.dlq, Key: s.r.Key, Value: s.r.Value}
	dl.Headers = append(append(dl.Headers, s.r.Headers...),
		kgo.RecordHeader{Key: "idem-dead-letter-reason", Value: []byte(reason.Error())},
		kgo.RecordHeader{Key: "idem-source", Value: []byte(source(s.r))})
	if err := s.k.cl.ProduceSync(ctx, dl).FirstErr(); err != nil {
		return fmt.Errorf("idemkafka: produce the dead letter: %w", err)
	}
	return nil
}
