package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemhq/idem/idemconsume"
)

// Config is the adapter's settings.
type Config struct {
	// IDHeaders are the headers read for the producer's id when the
	// message-id property is empty, the first present wins. Defaults to
	// Idempotency-Key, then the CloudEvents id of the AMQP binding
	// (cloudEvents:id, cloudEvents_id).
	IDHeaders []string
	// DeadLetterExchange, if set, receives each dead letter (with the
	// delivery's routing key) before the delivery is acked; Consume puts
	// the channel in confirm mode for it. Empty: the delivery is rejected
	// without requeue, for the queue's own dead-letter exchange.
	DeadLetterExchange string
}

// Consume processes the deliveries of queue on ch with p until ctx ends or
// the channel closes; it returns nil when ctx ended, or an error otherwise.
// It cancels its consumer before returning; deliveries not settled then are
// requeued by the broker when ch closes.
func Consume(ctx context.Context, ch *amqp.Channel, queue string, p idemconsume.Processor, cfg *Config) error {
	if ch == nil || p == nil || cfg == nil {
		return errors.New("idemamqp: Consume needs a channel, a processor and a Config")
	}
	if cfg.DeadLetterExchange != "" {
		if err := ch.Confirm(false); err != nil {
			return fmt.Errorf("idemamqp: confirm mode, for the dead letters: %w", err)
		}
	}
	headers := cfg.IDHeaders
	if len(headers) == 0 {
		headers = []string{"Idempotency-Key", "cloudEvents:id", "cloudEvents_id"}
	}
	tag := fmt.Sprintf("idemamqp-%p", ch)
	deliveries, err := ch.ConsumeWithContext(ctx, queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("idemamqp: consume %s: %w", queue, err)
	}
	a := &consumer{ch: ch, p: p, cfg: cfg, headers: headers, seen: map[string]int{}}
	defer func() { _ = ch.Cancel(tag, false) }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("idemamqp: the channel closed")
			}
			a.delivery(ctx, &d)
		}
	}
}

type consumer struct {
	ch      *amqp.Channel
	p       idemconsume.Processor
	cfg     *Config
	headers []string
	mu      sync.Mutex
	seen    map[string]int // deliveries per key counted here, for classic queues
}

func (a *consumer) delivery(ctx context.Context, d *amqp.Delivery) {
	m := &idemconsume.Message{Payload: d.Body, Headers: make(map[string]string, len(d.Headers))}
	for k, v := range d.Headers {
		if s, ok := v.(string); ok {
			m.Headers[k] = s
		}
	}
	m.ID = d.MessageId
	if m.ID == "" {
		m.ID = idemconsume.ProducerID(func(k string) string { return m.Headers[k] }, a.headers)
	}
	m.Deliveries = a.count(m.ID, d)
	res, err := a.p.Process(ctx, m, &settler{a: a, d: d})
	switch {
	case err == nil && res.Action != idemconsume.Retry:
		a.forget(m.ID)
	case err != nil && ctx.Err() == nil:
		// Not settled (a dead letter the broker did not confirm): back to
		// the queue rather than held until the channel closes.
		_ = d.Nack(false, true)
	}
}

// count returns the delivery's number: the quorum queue's count, or this
// process's when it counted more (classic queues count nothing).
func (a *consumer) count(key string, d *amqp.Delivery) int {
	n := 1
	if c, ok := d.Headers["x-delivery-count"].(int64); ok {
		n = int(c) + 1
	}
	if key == "" {
		return n
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen[key]++
	if !d.Redelivered {
		a.seen[key] = 1
	}
	return max(n, a.seen[key])
}

func (a *consumer) forget(key string) {
	a.mu.Lock()
	delete(a.seen, key)
	a.mu.Unlock()
}

type settler struct {
	a *consumer
	d *amqp.Delivery
}

func (s *settler) Ack(context.Context) error { return s.d.Ack(false) }

func (s *settler) Retry(ctx context.Context, delay time.Duration) error {
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done(): // the channel's close requeues it
		return ctx.Err()
	case <-t.C:
	}
	return s.d.Nack(false, true)
}

func (s *settler) DeadLetter(ctx context.Context, reason error) error {
	if s.a.cfg.DeadLetterExchange == "" {
		return s.d.Reject(false)
	}
	h := amqp.Table{}
	for k, v := range s.d.Headers {
		h[k] = v
	}
	h["x-idem-dead-letter-reason"] = reason.Error()
	dc, err := s.a.ch.PublishWithDeferredConfirmWithContext(ctx, s.a.cfg.DeadLetterExchange, s.d.RoutingKey, false, false, amqp.Publishing{
		Headers: h, ContentType: s.d.ContentType, ContentEncoding: s.d.ContentEncoding,
		DeliveryMode: amqp.Persistent, MessageId: s.d.MessageId, Timestamp: s.d.Timestamp,
		Type: s.d.Type, CorrelationId: s.d.CorrelationId, Body: s.d.Body,
	})
	if err != nil {
		return fmt.Errorf("idemamqp: publish the dead letter: %w", err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("idemamqp: wait for the dead letter's confirm: %w", err)
	}
	if !ok {
		return errors.New("idemamqp: the broker refused the dead letter (a nack)")
	}
	return s.d.Ack(false)
}
