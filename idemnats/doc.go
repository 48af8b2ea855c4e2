// Package idemnats consumes NATS JetStream messages exactly once per
// consumer name, on nats.go's jetstream package: each message's handler runs
// in the transaction of its idem key (package idemconsume), and the message
// is acknowledged only once that transaction answered.
//
//	import "github.com/idemhq/idem/idemnats"
//
// # Use
//
//	js, _ := jetstream.New(nc)
//	cons, _ := js.CreateOrUpdateConsumer(ctx, "PAYMENTS", jetstream.ConsumerConfig{
//		Durable:   "ledger",
//		AckPolicy: jetstream.AckExplicitPolicy, // required
//		AckWait:   30 * time.Second,
//	})
//	c, _ := idemconsume.New(keys, &idemconsume.Config{Name: "ledger"}, handle)
//	err := idemnats.Consume(ctx, cons, c, &idemnats.Config{})
//
// # What Consume does
//
// Each message is processed by p (usually an *idemconsume.Consumer) while
// a heartbeat tells the server the message is in progress (InProgress,
// every third of the consumer's AckWait), so a slow handler keeps its
// message. Then it is settled: Ack is a double ack (DoubleAck, answered by
// the server); Retry is NakWithDelay; DeadLetter publishes the message to
// Config.DeadLetterSubject, when set, with the headers
// Idem-Dead-Letter-Reason and Idem-Source ("<stream>/<sequence>"), and
// terminates it with TermWithReason (the server's MSG_TERMINATED advisory
// carries the reason).
//
// A message whose instance died before it was settled is redelivered once
// the consumer's AckWait passes: the redelivery replays what committed. The
// consumer's MaxDeliver, if set, must exceed idemconsume.Config.MaxDeliveries,
// or the server stops redelivering a message before it can be dead-lettered
// (and a message whose key was long in progress may be dropped): leave it
// unlimited.
//
// The key is the producer's id, read from Config.IDHeaders (Nats-Msg-Id
// first); without one, the position "nats:<stream>/<sequence>". JetStream
// drops a second publish with the same Nats-Msg-Id within the stream's
// duplicate window (2 minutes by default); idem catches the later ones, and
// those of producers that set another header, for the key's TTL.
package idemnats
