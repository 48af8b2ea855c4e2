// Package idemamqp consumes RabbitMQ (AMQP 0.9.1) messages exactly once per
// consumer name, on amqp091-go: each message's handler runs in the
// transaction of its idem key (package idemconsume), and the message is
// acknowledged only once that transaction answered.
//
//	import "github.com/idemhq/idem/idemamqp"
//
// # Use
//
//	ch, _ := conn.Channel()
//	_ = ch.Qos(16, 0, false)
//	c, _ := idemconsume.New(keys, &idemconsume.Config{Name: "ledger"}, handle)
//	err := idemamqp.Consume(ctx, ch, "payments", c, &idemamqp.Config{DeadLetterExchange: "payments.dlx"})
//
// # What Consume does
//
// It consumes with manual acks and processes each delivery with p (usually
// an *idemconsume.Consumer), one at a time, then settles it: Ack is
// Delivery.Ack; Retry waits the delay and then Nacks with requeue (AMQP
// has no delayed redelivery, so the wait holds this consumer, not the
// queue); DeadLetter publishes the message to Config.DeadLetterExchange,
// with the header x-idem-dead-letter-reason, waits for the broker's
// publisher confirm and then acks, or, with no exchange configured, rejects
// it without requeue, so that the queue's own dead-letter exchange
// (x-dead-letter-exchange) receives it, with the reason only in the log.
// A delivery whose channel closed before it was settled is requeued by the
// broker with the redelivered flag, and its redelivery replays what
// committed.
//
// The key is the AMQP message-id property, then the headers of
// Config.IDHeaders. AMQP has no position a redelivery keeps (a delivery tag
// is the channel's), so a message with neither is dead-lettered
// (idemconsume.ErrNoKey). The delivery count is the quorum queues'
// x-delivery-count header (plus one); on classic queues, which only set the
// redelivered flag, it is counted by this process, so there a poison message
// that kills its process each time is never dead-lettered.
package idemamqp
