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
	// Batch, above 1, processes up to Batch consecutive records of a
	// partition in one database transaction
	// (idemconsume.Consumer.ProcessBatch), and the Processor must be an
	// idemconsume.BatchProcessor. Records from the first one the batch
	// did not settle on are then processed one transaction each, in order
	// (those of them that committed in the batch replay), so offsets still
	// move only past settled records; but a record retried this way
	// commits after the records behind it in its batch. Defaults to 0: one
	// transaction per record.
	Batch int
}

// Consume consumes with cl until ctx ends, processing every record with p
// (usually an *idemconsume.Consumer), and returns nil then; or an error if
// cl or cfg is unfit, or cl was closed. cl must consume as a group member
// with kgo.DisableAutoCommit and kgo.BlockRebalanceOnPoll: Consume checks
// both. When ctx ends, Consume commits what was settled and closes cl,
// leaving the group. Leaving waits for a rebalance in progress to end, so
// a shutdown during one can take up to the group's rebalance timeout
// (kgo.RebalanceTimeout, 60 s by default): set it to what a deployment's
// shutdown can wait.
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
	if cfg.Batch > 1 {
		k.bp, k.batch = p.(idemconsume.BatchProcessor), cfg.Batch
	}
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
	case cfg.Batch < 0:
		return errors.New("idemkafka: Config.Batch must not be negative")
	case cl.OptValue(kgo.ConsumerGroup) == "":
		return errors.New("idemkafka: the client must consume in a group (kgo.ConsumerGroup)")
	case cl.OptValue(kgo.DisableAutoCommit) != true:
		return errors.New("idemkafka: the client must not autocommit (kgo.DisableAutoCommit): an offset committed before the record's transaction answered loses the record")
	case cl.OptValue(kgo.BlockRebalanceOnPoll) != true:
		return errors.New("idemkafka: the client must block rebalances while records are processed (kgo.BlockRebalanceOnPoll)")
	}
	if _, ok := p.(idemconsume.BatchProcessor); cfg.Batch > 1 && !ok {
		return fmt.Errorf("idemkafka: Config.Batch needs an idemconsume.BatchProcessor, and %T is not one", p)
	}
	return nil
}

type consumer struct {
	cl      *kgo.Client
	p       idemconsume.Processor
	bp      idemconsume.BatchProcessor // with batch, when Config.Batch > 1
	batch   int
	dlq     string
	headers []string
}

// partition processes one partition's records in order and returns the last
// one settled, or nil.
func (k *consumer) partition(ctx context.Context, recs []*kgo.Record) *kgo.Record {
	if k.bp != nil {
		return k.batches(ctx, recs)
	}
	var last *kgo.Record
	for _, r := range recs {
		if !k.record(ctx, r, 1) {
			break
		}
		last = r
	}
	return last
}

// batches is partition with Config.Batch: each run of up to k.batch
// records in one transaction, then, from the first record the batch did not
// settle on, the rest of the run one record at a time.
func (k *consumer) batches(ctx context.Context, recs []*kgo.Record) *kgo.Record {
	var last *kgo.Record
	for len(recs) > 0 {
		run := recs[:min(len(recs), k.batch)]
		recs = recs[len(run):]
		ms := make([]*idemconsume.Message, len(run))
		for i, r := range run {
			ms[i] = message(r, k.headers)
			ms[i].Deliveries = 1
		}
		res, errs := k.bp.ProcessBatch(ctx, ms, func(i int) idemconsume.Settler { return &settler{k: k, r: run[i]} })
		done := 0
		for done < len(run) && errs[done] == nil && res[done].Action != idemconsume.Retry {
			done++
		}
		if done > 0 {
			last = run[done-1]
		}
		if done == len(run) {
			continue
		}
		delay := res[done].Delay
		if errs[done] != nil {
			delay = time.Second // the Settler failed: as in record
		}
		if !sleep(ctx, delay) {
			return last
		}
		for _, r := range run[done:] {
			if !k.record(ctx, r, 2) {
				return last
			}
			last = r
		}
	}
	return last
}

// record processes r until it is settled (acked or dead-lettered), and
// reports whether it was; false only when ctx ended first. first is the
// number of r's first delivery here.
func (k *consumer) record(ctx context.Context, r *kgo.Record, first int) bool {
	m := message(r, k.headers)
	for n := first; ; n++ {
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
		if !sleep(ctx, res.Delay) {
			return false
		}
	}
}

// sleep waits for d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
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
