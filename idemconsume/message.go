package idemconsume

import "github.com/idemhq/idem/idem"

// A Message is one delivery of a message, in the broker-neutral form the
// adapters fill in.
type Message struct {
	// ID is the id the producer gave the message, the same on every
	// publish of it (ProducerID reads the usual headers). It is the key
	// when it is set.
	ID string
	// Position is where the broker stored the message, e.g.
	// "kafka:orders/3/1207" or "nats:ORDERS/88". It is the key only when ID
	// is empty: it tells a redelivery of one publish, but not a producer's
	// second publish of the same message, which gets a new position.
	Position string
	// Payload is the message's body; its hash (idem.HashBytes) is the
	// key's request hash.
	Payload []byte
	// Headers are the message's headers, the first value of each; the
	// Observer reads trace context from them (an OpenTelemetry
	// propagation.MapCarrier over them works as it is).
	Headers map[string]string
	// Deliveries is how many times the message has been delivered, this
	// delivery included: 1 for the first. 0 means unknown, taken as 1.
	Deliveries int
}

// key is the message's idempotency key: the producer's id, else the
// broker's position.
func (m *Message) key() (string, error) {
	if m.ID != "" {
		return m.ID, nil
	}
	if m.Position != "" {
		return m.Position, nil
	}
	return "", ErrNoKey
}

func (m *Message) deliveries() int { return max(m.Deliveries, 1) }

// DefaultIDHeaders are the headers ProducerID reads when an adapter's
// configuration names none, in this order: an explicit Idempotency-Key,
// then the CloudEvents id in the Kafka binding's spelling (ce_id) and in
// the HTTP and NATS bindings' (ce-id).
func DefaultIDHeaders() []string { return []string{"Idempotency-Key", "ce_id", "ce-id"} }

// ProducerID returns the producer's id for a message: the value of the
// first of names that header returns non-empty. A CloudEvents id (ce_id,
// ce-id, cloudEvents:id, cloudEvents_id) is unique only with its event's
// source, so it is returned as "<source> <id>" when the matching source
// header is set; one longer than idem.MaxKeyLen is replaced by
// "ce:" + idem.HashBytes of it.
func ProducerID(header func(name string) string, names []string) string {
	for _, name := range names {
		id := header(name)
		if id == "" {
			continue
		}
		src, ok := cloudEventsSource[name]
		if !ok {
			return id
		}
		if source := header(src); source != "" {
			id = source + " " + id
		}
		if len(id) > idem.MaxKeyLen {
			id = "ce:" + idem.HashBytes([]byte(id))
		}
		return id
	}
	return ""
}

// cloudEventsSource maps each binding's spelling of the CloudEvents id
// header to its source header.
var cloudEventsSource = map[string]string{
	"ce_id":          "ce_source",          // Kafka
	"ce-id":          "ce-source",          // HTTP, NATS
	"cloudEvents:id": "cloudEvents:source", // AMQP
	"cloudEvents_id": "cloudEvents_source", // AMQP, JMS spelling
}
