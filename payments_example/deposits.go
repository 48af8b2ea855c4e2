package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/payments_example/internal/deposits"
)

// startDeposits connects to the NATS server at url and credits the
// deposits of its stream (package deposits) exactly once each, with keys
// (the service's idem.Client, whose Observer counts each event's call);
// obs hears of every delivery. It returns once the consumer is made, and a
// function that stops consuming (as the end of ctx does): it waits for the
// message in hand to be settled or abandoned, closes the connection and
// returns the consumer's error, if any.
func startDeposits(ctx context.Context, url string, keys *idem.Client, obs idemconsume.Observer, log *slog.Logger) (func() error, error) {
	nc, err := nats.Connect(url, nats.Name(serviceName), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("deposits: connect to NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("deposits: %w", err)
	}
	cons, err := deposits.Subscribe(ctx, js)
	if err != nil {
		nc.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var consumer sync.WaitGroup
	var consumeErr error
	consumer.Go(func() {
		if consumeErr = deposits.Consume(ctx, cons, keys, obs); consumeErr != nil {
			log.Error("deposits: the consumer stopped", "err", consumeErr)
		}
	})
	return func() error {
		cancel()
		consumer.Wait()
		nc.Close()
		return consumeErr
	}, nil
}

// resultKey is the attribute of deposits.messages that says what became
// of a delivery (Prometheus: deposits_result).
const resultKey = attribute.Key("deposits.result")

// consumerMetrics is the deposits consumer's Observer: it counts every
// delivery in deposits.messages by deposits.result (credited, refused,
// duplicate, retried, dead_lettered) and those delivered more than once in
// deposits.redeliveries, and passes each to next (idemotel's span per
// message).
type consumerMetrics struct {
	next         idemconsume.Observer
	messages     metric.Int64Counter
	redeliveries metric.Int64Counter
	results      map[string]metric.MeasurementOption
}

// newConsumerMetrics returns the Observer of the deposits consumer,
// recording on mp.
func newConsumerMetrics(mp metric.MeterProvider, next idemconsume.Observer) (*consumerMetrics, error) {
	m := mp.Meter("github.com/idemhq/idem/payments_example")
	messages, err1 := m.Int64Counter("deposits.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries of deposit events, by what became of them."))
	redeliveries, err2 := m.Int64Counter("deposits.redeliveries", metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries of deposit events that had been delivered before."))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	o := &consumerMetrics{next: next, messages: messages, redeliveries: redeliveries, results: map[string]metric.MeasurementOption{}}
	for _, r := range []string{"credited", "refused", "duplicate", "retried", "dead_lettered"} {
		o.results[r] = metric.WithAttributes(resultKey.String(r))
	}
	return o, nil
}

// MessageStart implements idemconsume.Observer.
func (o *consumerMetrics) MessageStart(ctx context.Context, consumer string, m *idemconsume.Message) context.Context {
	return o.next.MessageStart(ctx, consumer, m)
}

// MessageEnd implements idemconsume.Observer.
func (o *consumerMetrics) MessageEnd(ctx context.Context, e idemconsume.Event) {
	result := "retried"
	switch {
	case e.Action == idemconsume.DeadLetter:
		result = "dead_lettered"
	case e.Outcome == idem.OutcomeExecuted:
		result = "credited"
	case e.Outcome == idem.OutcomeRefused:
		result = "refused"
	case e.Outcome == idem.OutcomeReplayed:
		result = "duplicate"
	}
	o.messages.Add(ctx, 1, o.results[result])
	if e.Deliveries > 1 {
		o.redeliveries.Add(ctx, 1)
	}
	o.next.MessageEnd(ctx, e)
}
