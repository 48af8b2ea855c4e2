package lincheck

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// Settlement is what a consumer told the broker about one delivery.
type Settlement uint8

const (
	// Unsettled is a delivery the consumer settled in no way: its context
	// ended before the transaction answered, and the broker redelivers.
	Unsettled Settlement = iota
	// Acked is a delivery acknowledged: the broker forgets the message.
	Acked
	// Retried is a delivery the broker is told to make again.
	Retried
	// DeadLettered is a delivery moved to the dead-letter destination.
	DeadLettered
)

var settlementNames = [...]string{
	Unsettled:    "unsettled",
	Acked:        "ack",
	Retried:      "retry",
	DeadLettered: "dead_letter",
}

func (s Settlement) String() string {
	if int(s) < len(settlementNames) {
		return settlementNames[s]
	}
	return fmt.Sprintf("Settlement(%d)", uint8(s))
}

// A Delivery is one recorded delivery of a message to a consumer
// (idemconsume.Consumer.Process): an idem.Run under the message's key, then
// at most one settlement.
//
// The register of a message key is its stored result, as for Do's keys,
// except that a consumer's stored value names no delivery: a Replayed
// delivery observes the register written with its payload, whichever
// delivery wrote it. Which one did is told by the effect rows, each tagged
// with the op id of the delivery whose handler wrote it.
type Delivery struct {
	// Call is the delivery as Do's history holds it: Key is the message's
	// key, Hash its payload's hash, Op the delivery's own id, which its
	// handler writes to the effect row; Kind is how the Run ended, as the
	// Result.Outcome of Process says (Value is Op for Executed, and not
	// read otherwise). End is when the delivery was settled, or when
	// Process returned if it settled nothing: a settlement claims what the
	// outcome says by the time the broker hears it.
	Call
	Settled Settlement
}

// CheckDeliveries checks the deliveries of one consumer against the
// write-once register of each message key, and against final, the database
// read after every delivery that was not acknowledged or dead-lettered was
// redelivered until it was (those deliveries included). final.Keys holds
// each message key's row in the consumer's scope (Stored.Op is not read);
// final.Ledger holds, per key, the op id of every committed effect row,
// counted without a unique constraint. perKey bounds the linearizability
// check's time for one key, as Check's does.
//
// Besides the register, it asks what the consumer promises the broker:
// a delivery is acknowledged exactly when its Run executed or replayed
// (so an Ack means that the message's effect committed by the time of the
// Ack), dead-lettered with ErrMismatch, and otherwise retried or left
// unsettled; a stored key has exactly one effect row, written by a
// delivery that executed or whose outcome was unknown, with the key's
// payload; a key without a row, or with a refusal, has none.
func CheckDeliveries(deliveries []Delivery, final Final, perKey time.Duration) Report {
	r := Report{Calls: len(deliveries), ByKind: map[Kind]int{}}
	byKey := map[string][]*Delivery{}
	ops := map[int64]*Delivery{}
	for i := range deliveries {
		d := &deliveries[i]
		r.ByKind[d.Kind]++
		byKey[d.Key] = append(byKey[d.Key], d)
		ops[d.Op] = d
	}
	r.Keys = len(byKey)
	keys := setOf(byKey)
	maps.Copy(keys, setOf(final.Keys))
	maps.Copy(keys, setOf(final.Ledger))
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		history := byKey[k]
		for _, d := range history {
			if d.Contradiction != "" {
				r.Violations = append(r.Violations, Violation{Key: k, Op: d.Op, What: d.Contradiction})
			}
			if !settles(d.Kind, d.Settled) {
				r.Violations = append(r.Violations, Violation{Key: k, Op: d.Op,
					What: fmt.Sprintf("settled %s, but Run's outcome was %s", d.Settled, d.Kind)})
			}
		}
		stored := final.Keys[k]
		switch linearizableDeliveries(history, stored, perKey) {
		case porcupine.Illegal:
			r.Violations = append(r.Violations, Violation{Key: k,
				What: "not linearizable as a write-once register: " + describeDeliveries(history, stored)})
		case porcupine.Unknown:
			r.Inconclusive = append(r.Inconclusive, k)
		}
		r.Violations = append(r.Violations, reconcileDeliveries(k, history, ops, final)...)
	}
	return r
}

// settles says whether a consumer may settle a delivery whose Run ended as
// k as s: an Ack for an execution or a replay only, a dead letter for a
// mismatch or a failure (the delivery limit), and a retry, or nothing when
// its context ended, for the rest.
func settles(k Kind, s Settlement) bool {
	switch k {
	case Executed, Replayed:
		return s == Acked
	case Mismatch:
		return s == DeadLettered
	case Failed:
		return s == Retried || s == DeadLettered || s == Unsettled
	case Unknown, InProgress:
		return s == Retried || s == Unsettled
	}
	return false
}

// linearizableDeliveries runs Check's write-once register over one message
// key's deliveries. A consumer's stored value names no delivery, so every
// delivery is put to the register without its op id: a write is one of
// its payload, a replay observes one, and which delivery wrote it is left
// to reconcileDeliveries, from the effect rows.
func linearizableDeliveries(history []*Delivery, stored Stored, timeout time.Duration) porcupine.CheckResult {
	calls := make([]Call, len(history))
	ptrs := make([]*Call, len(history))
	for i, d := range history {
		calls[i] = d.Call
		calls[i].Op, calls[i].Value = 0, 0
		ptrs[i] = &calls[i]
	}
	stored.Op = 0
	return linearizable(ptrs, stored, timeout)
}

// reconcileDeliveries compares one message key's deliveries with what the
// database holds.
func reconcileDeliveries(key string, history []*Delivery, ops map[int64]*Delivery, final Final) []Violation {
	var v []Violation
	add := func(op int64, format string, args ...any) {
		v = append(v, Violation{Key: key, Op: op, What: fmt.Sprintf(format, args...)})
	}
	effects := final.Ledger[key]
	stored, hasRow := final.Keys[key]
	if n := final.Rows[key]; n > 1 {
		add(0, "%d rows in the key table: the message executed more than once", n)
	}
	for _, op := range effects {
		d := ops[op]
		switch {
		case d == nil:
			add(op, "an effect row committed for a delivery that nobody made")
		case d.Key != key:
			add(op, "an effect row committed under key %s for a delivery of key %s", key, d.Key)
		case d.Kind == Failed:
			add(op, "its effect committed, but the delivery reported a plain failure (settled %s): %s", d.Settled, d.Err)
		case d.Kind != Executed && d.Kind != Unknown:
			add(op, "its effect committed, but the delivery reported %s (settled %s)", d.Kind, d.Settled)
		case hasRow && d.Hash != stored.Hash:
			add(op, "its effect committed with payload %s, but the key stored payload %s", d.Hash, stored.Hash)
		}
	}
	switch {
	case !hasRow:
		if len(effects) > 0 {
			add(0, "effect rows %v committed without the key's row", effects)
		}
	case stored.Status == "in_progress":
		add(0, "the key's row was left 'in_progress'")
	case stored.Refused:
		if len(effects) > 0 {
			add(0, "the key stored a refusal, yet effect rows %v committed (a refusal rolls the handler's writes back)", effects)
		}
	case len(effects) != 1:
		add(0, "%d effect rows committed (deliveries %v): the message's effect committed other than once", len(effects), effects)
	}
	completed := hasRow && stored.Status != "in_progress" && !stored.Refused
	for _, d := range history {
		switch {
		case d.Kind == Executed && !d.Refused && (!completed || !slices.Contains(effects, d.Op)):
			add(d.Op, "acknowledged as its own execution, which did not commit (effect rows %v)", effects)
		case d.Kind == Executed && d.Refused && (!hasRow || !stored.Refused):
			add(d.Op, "acknowledged as a refusal, which was not stored")
		case d.Kind == Replayed && (!hasRow || stored.Hash != d.Hash || stored.Refused != d.Refused):
			add(d.Op, "acknowledged as a duplicate, but the key does not hold its payload's result")
		case d.Kind == Mismatch && hasRow && stored.Hash == d.Hash:
			add(d.Op, "dead-lettered with ErrMismatch, but the stored payload is the delivery's own")
		}
	}
	return v
}

// describeDeliveries summarises a message key's deliveries for a
// violation's message.
func describeDeliveries(history []*Delivery, stored Stored) string {
	calls := make([]*Call, len(history))
	settled := map[Settlement]int{}
	for i, d := range history {
		calls[i] = &d.Call
		settled[d.Settled]++
	}
	s := describe(calls, stored) + "; settled"
	for _, a := range []Settlement{Acked, Retried, DeadLettered, Unsettled} {
		s += fmt.Sprintf(" %s %d", a, settled[a])
	}
	return s
}
