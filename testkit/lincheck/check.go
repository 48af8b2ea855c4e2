package lincheck

import (
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// Report is what Check found.
type Report struct {
	Calls  int          // calls in the history
	ByKind map[Kind]int // calls by how they ended
	Keys   int          // distinct keys called
	// Violations lists every breach, linearizability and reconciliation
	// alike, in key order.
	Violations []Violation
	// Inconclusive lists the keys whose linearizability check ran out of
	// time: neither proved nor refuted (their reconciliation still ran).
	Inconclusive []string
}

// Check checks calls against the write-once register of each key, and
// against final, the database read after every call returned. perKey bounds
// the time the linearizability check may take for one key; a key it cannot
// decide in that time is reported inconclusive, never as a violation, so
// that the verdict does not depend on the machine's speed.
func Check(calls []Call, final Final, perKey time.Duration) Report {
	r := Report{Calls: len(calls), ByKind: map[Kind]int{}}
	byKey := map[string][]*Call{}
	for i := range calls {
		c := &calls[i]
		r.ByKind[c.Kind]++
		byKey[c.Key] = append(byKey[c.Key], c)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	for k := range final.Keys {
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
	}
	for k := range final.Ledger {
		if _, ok := byKey[k]; !ok {
			if _, ok := final.Keys[k]; !ok {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	r.Keys = len(byKey)

	ops := map[int64]*Call{}
	for i := range calls {
		ops[calls[i].Op] = &calls[i]
	}
	for _, k := range keys {
		history := byKey[k]
		for _, c := range history {
			if c.Contradiction != "" {
				r.Violations = append(r.Violations, Violation{Key: k, Op: c.Op, What: c.Contradiction})
			}
		}
		switch linearizable(history, final.Keys[k], perKey) {
		case porcupine.Illegal:
			r.Violations = append(r.Violations, Violation{Key: k,
				What: "not linearizable as a write-once register: " + describe(history, final.Keys[k])})
		case porcupine.Unknown:
			r.Inconclusive = append(r.Inconclusive, k)
		}
		r.Violations = append(r.Violations, reconcile(k, history, ops, final)...)
	}
	return r
}

// linearizable runs porcupine over one key's history, closed by the stored
// row as an observation after every call. Plain failures are left out: the
// specification lets them do nothing, and a failure that wrote shows as a
// value that no write could have produced. Such a value is found before the
// search, which would otherwise have to try every order of the history to
// refute it.
func linearizable(history []*Call, stored Stored, timeout time.Duration) porcupine.CheckResult {
	writes := map[int64]bool{}
	for _, c := range history {
		if c.Kind == Executed || c.Kind == Unknown {
			writes[c.Op] = true
		}
	}
	for _, c := range history {
		if c.Kind == Replayed && !writes[c.Value] {
			return porcupine.Illegal
		}
	}
	if stored.Status != "" && stored.Status != "in_progress" && !writes[stored.Op] {
		return porcupine.Illegal
	}
	var last int64
	for _, c := range history {
		last = max(last, c.End)
	}
	ops := make([]porcupine.Operation, 0, len(history)+1)
	for _, c := range history {
		if c.Kind == Failed {
			continue
		}
		end := c.End
		if c.Kind == Unknown {
			// It may take effect at any moment after it began, up to the
			// final observation.
			end = last + 1
		}
		ops = append(ops, porcupine.Operation{ClientId: c.Client, Input: c, Call: c.Start, Return: end})
	}
	// A row left 'in_progress' holds no value (reconcile reports it).
	final := register{}
	if stored.Status != "" && stored.Status != "in_progress" {
		final = register{written: true, op: stored.Op, refused: stored.Refused, hash: stored.Hash}
	}
	ops = append(ops, porcupine.Operation{Input: observation{final}, Call: last + 2, Return: last + 3})
	return porcupine.CheckOperationsTimeout(model, ops, timeout)
}

// reconcile compares one key's history with what the database holds.
func reconcile(key string, history []*Call, ops map[int64]*Call, final Final) []Violation {
	var v []Violation
	add := func(op int64, format string, args ...any) {
		v = append(v, Violation{Key: key, Op: op, What: fmt.Sprintf(format, args...)})
	}
	ledger := final.Ledger[key]
	stored, hasRow := final.Keys[key]
	if n := final.Rows[key]; n > 1 {
		add(0, "%d rows in the key table: the key executed more than once", n)
	}
	if len(ledger) > 1 {
		add(0, "%d ledger rows committed (ops %v): the key executed more than once", len(ledger), ledger)
	}
	for _, op := range ledger {
		c := ops[op]
		switch {
		case c == nil:
			add(op, "a ledger row committed for an operation that no call made")
		case c.Key != key:
			add(op, "a ledger row committed under key %s for a call of key %s", key, c.Key)
		}
	}
	switch {
	case !hasRow:
		if len(ledger) > 0 {
			add(0, "ledger rows %v committed without the key's row", ledger)
		}
	case stored.Status == "in_progress":
		add(0, "the key's row was left 'in_progress'")
	case stored.Refused:
		if len(ledger) > 0 {
			add(0, "the key committed a refusal, yet ledger rows %v committed (a refusal rolls fn's writes back)", ledger)
		}
	default:
		if !slices.Contains(ledger, stored.Op) {
			add(stored.Op, "the stored result names an execution whose ledger row did not commit (ledger %v)", ledger)
		}
	}
	if hasRow && stored.Status != "in_progress" {
		c := ops[stored.Op]
		switch {
		case c == nil:
			add(stored.Op, "the stored result names an operation that no call made")
		case c.Key != key:
			add(stored.Op, "the stored result names a call of key %s", c.Key)
		case c.Kind == Failed:
			add(stored.Op, "committed, but the call reported a plain failure: %s", c.Err)
		case c.Kind != Executed && c.Kind != Unknown:
			add(stored.Op, "committed, but the call reported %s", c.Kind)
		case c.Hash != stored.Hash:
			add(stored.Op, "stored with request hash %s, but the call's was %s", stored.Hash, c.Hash)
		}
	}
	for _, c := range history {
		switch {
		case c.Kind == Executed && (!hasRow || stored.Op != c.Op):
			add(c.Op, "the call reported its own execution, which did not commit")
		case c.Kind == Mismatch && hasRow && stored.Hash == c.Hash:
			add(c.Op, "ErrMismatch, but the stored request hash is the call's own")
		case c.Kind == Replayed && (!hasRow || stored.Op != c.Value):
			add(c.Op, "replayed op %d, but the stored result is another", c.Value)
		}
	}
	return v
}

// describe summarises a key's history for a violation's message.
func describe(history []*Call, stored Stored) string {
	byKind := map[Kind]int{}
	for _, c := range history {
		byKind[c.Kind]++
	}
	s := fmt.Sprintf("%d calls (", len(history))
	for i, k := range Kinds {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s %d", k, byKind[k])
	}
	return s + fmt.Sprintf("), stored %+v", stored)
}
