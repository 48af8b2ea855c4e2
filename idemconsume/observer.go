package idemconsume

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem/idem"
)

// An Observer hears of every delivery a Consumer processes: metrics, logs
// and traces hang here. MessageStart runs before the handler's transaction;
// the context it returns is the handler's (a span started from the trace
// context in m.Headers continues the producer's trace) and MessageEnd's.
// MessageEnd runs once per MessageStart, after the delivery was settled.
// Both run on Process's goroutine and must be safe for concurrent use.
//
// Neither receives the message's key or payload: they are the producer's
// data.
type Observer interface {
	MessageStart(ctx context.Context, consumer string, m *Message) context.Context
	MessageEnd(ctx context.Context, e Event)
}

// Event is how one delivery ended.
type Event struct {
	Consumer   string // Config.Name
	Deliveries int    // the delivery's number, 1 for the first
	Result
	SettleErr error         // what the Settler returned
	Duration  time.Duration // from MessageStart to the settled delivery
}

// Counters is an Observer that counts, per consumer. Its zero value is
// ready to use.
type Counters struct {
	m sync.Map // consumer name -> *counts
}

// Counts are one consumer's totals since its Counters was made.
type Counts struct {
	Processed    int64 // the handler's work committed (executed)
	Refused      int64 // a business refusal committed (refused)
	Duplicates   int64 // dropped without running the handler (replayed)
	Redeliveries int64 // deliveries whose number was above 1
	InProgress   int64 // retried because another delivery held the key
	Failed       int64 // retried after a technical failure or an unknown outcome
	Mismatches   int64 // dead-lettered: the key was used with another payload
	DeadLettered int64 // dead-lettered, for any reason (Mismatches included)
	SettleErrors int64 // the broker refused the action
}

type counts struct {
	processed, refused, duplicates, redeliveries, inProgress, failed,
	mismatches, deadLettered, settleErrors atomic.Int64
}

// MessageStart implements Observer.
func (c *Counters) MessageStart(ctx context.Context, _ string, _ *Message) context.Context {
	return ctx
}

// MessageEnd implements Observer.
func (c *Counters) MessageEnd(_ context.Context, e Event) {
	n := c.of(e.Consumer)
	if e.Deliveries > 1 {
		n.redeliveries.Add(1)
	}
	if e.SettleErr != nil {
		n.settleErrors.Add(1)
	}
	switch e.Outcome {
	case idem.OutcomeExecuted:
		n.processed.Add(1)
	case idem.OutcomeRefused:
		n.refused.Add(1)
	case idem.OutcomeReplayed:
		n.duplicates.Add(1)
	case idem.OutcomeInProgress:
		n.inProgress.Add(1)
	case idem.OutcomeMismatch:
		n.mismatches.Add(1)
	}
	switch {
	case e.Action == DeadLetter:
		n.deadLettered.Add(1)
	case e.Action == Retry && e.Outcome != idem.OutcomeInProgress:
		n.failed.Add(1)
	}
}

func (c *Counters) of(consumer string) *counts {
	if v, ok := c.m.Load(consumer); ok {
		return v.(*counts)
	}
	v, _ := c.m.LoadOrStore(consumer, new(counts))
	return v.(*counts)
}

// Get returns consumer's totals.
func (c *Counters) Get(consumer string) Counts {
	n := c.of(consumer)
	return Counts{
		Processed: n.processed.Load(), Refused: n.refused.Load(), Duplicates: n.duplicates.Load(),
		Redeliveries: n.redeliveries.Load(), InProgress: n.inProgress.Load(), Failed: n.failed.Load(),
		Mismatches: n.mismatches.Load(), DeadLettered: n.deadLettered.Load(), SettleErrors: n.settleErrors.Load(),
	}
}
