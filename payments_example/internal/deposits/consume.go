package deposits

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/idemnats"
)

// The stream and the consumer of the deposits.
const (
	// StreamName is the JetStream stream that holds the deposit events.
	StreamName = "DEPOSITS"
	// Subject is the subject deposit events are published to.
	Subject = "deposits"
	// ConsumerName names the durable consumer on StreamName and the
	// idemconsume consumer: the events' keys live in the scope
	// "consumer:deposits".
	ConsumerName = "deposits"
	// AckWait is how long a delivered message is the consumer's before
	// the server delivers it again: a message whose service died comes
	// back this soon. The message in hand keeps it while its handler
	// works (idemnats's heartbeat).
	AckWait = 5 * time.Second
	// batch is how many messages a service takes at a time. Each is the
	// service's from its delivery, so a batch must be credited within
	// AckWait; a small one also leaves less to come back after a crash.
	batch = 20
)

// Subscribe makes the stream StreamName (subject Subject, JetStream's
// defaults) if there is none, and returns the durable consumer
// ConsumerName on it, made or updated: explicit acks, AckWait, unlimited
// deliveries (idemconsume dead-letters first). A stream that exists, made
// by its operator, is used as it is.
func Subscribe(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	_, err := js.Stream(ctx, StreamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: StreamName, Subjects: []string{Subject}})
	}
	if err != nil {
		return nil, fmt.Errorf("deposits: stream %s: %w", StreamName, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, StreamName, jetstream.ConsumerConfig{
		Durable:   ConsumerName,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   AckWait,
	})
	if err != nil {
		return nil, fmt.Errorf("deposits: consumer %s: %w", ConsumerName, err)
	}
	return cons, nil
}

// Consume credits the deposits that cons (Subscribe's) delivers, each
// exactly once, until ctx ends: Handler runs under each event's key on
// keys (an *idem.Client: its table, TTL and Observer), and the message is
// acknowledged only after the key's transaction answered (package
// idemconsume, through idemnats). obs hears of every delivery; nil for
// none. It returns nil once ctx has ended and the message in hand is
// settled or abandoned (it then comes back after AckWait).
func Consume(ctx context.Context, cons jetstream.Consumer, keys idem.Beginner, obs idemconsume.Observer) error {
	c, err := idemconsume.New(keys, &idemconsume.Config{Name: ConsumerName, Observer: obs}, Handler)
	if err != nil {
		return fmt.Errorf("deposits: %w", err)
	}
	return idemnats.Consume(ctx, cons, c, &idemnats.Config{}, jetstream.PullMaxMessages(batch))
}
