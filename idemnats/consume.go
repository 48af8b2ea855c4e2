package idemnats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemhq/idem/idemconsume"
)

// Config is the adapter's settings.
type Config struct {
	// IDHeaders are the headers that carry the producer's id, the first
	// present wins. Defaults to Nats-Msg-Id, then
	// idemconsume.DefaultIDHeaders (Idempotency-Key, the CloudEvents id).
	IDHeaders []string
	// DeadLetterSubject, if set, receives each dead letter, published
	// through JetStream (so a stream must capture it) before the message
	// is terminated. Empty: the message is only terminated, with the
	// reason.
	DeadLetterSubject string
	// JetStream publishes the dead letters; required with
	// DeadLetterSubject.
	JetStream jetstream.JetStream
}

// Consume processes cons's messages with p until ctx ends, then stops
// consuming and returns nil once the message in hand is settled or
// abandoned; or an error if cons or cfg is unfit. cons must use explicit
// acks.
func Consume(ctx context.Context, cons jetstream.Consumer, p idemconsume.Processor, cfg *Config, opts ...jetstream.PullConsumeOpt) error {
	switch {
	case cons == nil || p == nil:
		return errors.New("idemnats: Consume needs a consumer and a processor")
	case cfg == nil:
		return errors.New("idemnats: no Config")
	case cfg.DeadLetterSubject != "" && cfg.JetStream == nil:
		return errors.New("idemnats: Config.DeadLetterSubject needs Config.JetStream to publish to it")
	}
	info := cons.CachedInfo()
	if info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return fmt.Errorf("idemnats: consumer %q must use explicit acks (AckExplicitPolicy): it uses %s", info.Name, info.Config.AckPolicy)
	}
	headers := cfg.IDHeaders
	if len(headers) == 0 {
		headers = append([]string{jetstream.MsgIDHeader}, idemconsume.DefaultIDHeaders()...)
	}
	n := &consumer{p: p, cfg: cfg, headers: headers, beat: max(info.Config.AckWait/3, 10*time.Millisecond)}
	// inFlight is held while a message is processed: once Consume has
	// taken it after ctx ended, no handler works any more.
	var inFlight sync.Mutex
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		inFlight.Lock()
		defer inFlight.Unlock()
		if ctx.Err() == nil { // else abandoned: redelivered after AckWait
			n.message(ctx, msg)
		}
	}, opts...)
	if err != nil {
		return fmt.Errorf("idemnats: consume: %w", err)
	}
	<-ctx.Done()
	cc.Stop()
	// Wait for the message in hand; those delivered after it return at
	// once (ctx ended), so Closed, which waits for them, comes.
	inFlight.Lock()
	inFlight.Unlock() //nolint:staticcheck // SA2001: the critical section is the wait itself
	<-cc.Closed()
	return nil
}

type consumer struct {
	p       idemconsume.Processor
	cfg     *Config
	headers []string
	beat    time.Duration
}

func (n *consumer) message(ctx context.Context, msg jetstream.Msg) {
	m := &idemconsume.Message{Payload: msg.Data(), Headers: map[string]string{}}
	h := msg.Headers()
	for k, v := range h {
		if len(v) > 0 {
			m.Headers[k] = v[0]
		}
	}
	m.ID = idemconsume.ProducerID(h.Get, n.headers)
	md, err := msg.Metadata()
	if err == nil {
		m.Position = "nats:" + position(md)
		m.Deliveries = int(md.NumDelivered)
	}
	// The heartbeat keeps the message ours while the handler works, so
	// the server does not hand it to another instance meanwhile.
	stop := make(chan struct{})
	beat := sync.WaitGroup{}
	beat.Go(func() {
		t := time.NewTicker(n.beat)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	})
	_, _ = n.p.Process(ctx, m, &settler{n: n, msg: msg, md: md})
	close(stop)
	beat.Wait()
}

func position(md *jetstream.MsgMetadata) string {
	return md.Stream + "/" + strconv.FormatUint(md.Sequence.Stream, 10)
}

type settler struct {
	n   *consumer
	msg jetstream.Msg
	md  *jetstream.MsgMetadata
}

func (s *settler) Ack(ctx context.Context) error { return s.msg.DoubleAck(ctx) }

func (s *settler) Retry(_ context.Context, delay time.Duration) error {
	return s.msg.NakWithDelay(delay)
}

func (s *settler) DeadLetter(ctx context.Context, reason error) error {
	if s.n.cfg.DeadLetterSubject != "" {
		dl := &nats.Msg{Subject: s.n.cfg.DeadLetterSubject, Data: s.msg.Data(), Header: nats.Header{}}
		for k, v := range s.msg.Headers() {
			if k != jetstream.MsgIDHeader { // the DLQ stream would drop a second dead letter as a duplicate
				dl.Header[k] = v
			}
		}
		dl.Header.Set("Idem-Dead-Letter-Reason", reason.Error())
		if s.md != nil {
			dl.Header.Set("Idem-Source", position(s.md))
		}
		if _, err := s.n.cfg.JetStream.PublishMsg(ctx, dl); err != nil {
			return fmt.Errorf("idemnats: publish the dead letter: %w", err)
		}
	}
	return s.msg.TermWithReason(reason.Error())
}
