package lincheck

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// CheckOperations checks the calls of an operation against the
// specification of each key (OpCall says what each call may have done),
// and against final, the database and the provider read after the run was
// settled: every operation left unfinished driven to its end with Resume,
// those calls included in calls. perKey bounds the linearizability check's
// time for one key, as Check's does.
//
// Reconciliation asks, per finished operation: each database step that the
// answer names has exactly one committed row, the one of the call the
// answer names, and a step it does not name has none; no step's output
// was recorded from an owner that had lost its lease; the provider holds
// exactly one effect for it, the one the answer names, made under the
// operation's derived key; the answer was stored by a call that reported
// Executed or Unknown; and every call that returned an answer returned the
// stored one. Across the run: no two effects under one derived key, and
// nothing left unfinished (Stats and the step records).
func CheckOperations(calls []OpCall, final OpFinal, perKey time.Duration) Report {
	r := Report{Calls: len(calls), ByKind: map[Kind]int{}}
	byKey := map[string][]*OpCall{}
	ops := map[int64]*OpCall{}
	for i := range calls {
		c := &calls[i]
		r.ByKind[c.Kind]++
		byKey[c.Key] = append(byKey[c.Key], c)
		ops[c.Op] = c
	}
	r.Keys = len(byKey)
	effects := map[string][]Effect{}
	byDerived := map[string][]Effect{}
	for _, e := range final.Effects {
		effects[e.Key] = append(effects[e.Key], e)
		byDerived[e.DerivedKey] = append(byDerived[e.DerivedKey], e)
	}
	keys := map[string]bool{}
	for _, m := range []map[string]bool{setOf(byKey), setOf(final.Keys), setOf(final.Ledger), setOf(effects)} {
		maps.Copy(keys, m)
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		history := byKey[k]
		for _, c := range history {
			if c.Contradiction != "" {
				r.Violations = append(r.Violations, Violation{Key: k, Op: c.Op, What: c.Contradiction})
			}
		}
		stored, hasRow := final.Keys[k]
		switch linearizableOp(history, stored, hasRow, perKey) {
		case porcupine.Illegal:
			r.Violations = append(r.Violations, Violation{Key: k,
				What: "not linearizable as an operation key: " + describeOp(history, stored, hasRow)})
		case porcupine.Unknown:
			r.Inconclusive = append(r.Inconclusive, k)
		}
		r.Violations = append(r.Violations, reconcileOp(k, history, ops, final, effects[k])...)
	}
	for _, d := range slices.Sorted(maps.Keys(byDerived)) {
		if es := byDerived[d]; len(es) > 1 {
			r.Violations = append(r.Violations, Violation{Key: es[0].Key,
				What: fmt.Sprintf("the provider made %d effects under the one idempotency key %s", len(es), d)})
		}
	}
	if final.Unfinished != 0 {
		r.Violations = append(r.Violations, Violation{Key: "(all)",
			What: fmt.Sprintf("Stats reports %d unfinished operations after every one was settled", final.Unfinished)})
	}
	if final.StepRecords != 0 {
		r.Violations = append(r.Violations, Violation{Key: "(all)",
			What: fmt.Sprintf("%d step records left after every operation finished", final.StepRecords)})
	}
	return r
}

func setOf[V any](m map[string]V) map[string]bool {
	s := make(map[string]bool, len(m))
	for k := range m {
		s[k] = true
	}
	return s
}

// registerOf is the state a stored row shows.
func registerOf(stored OpStored, hasRow bool) opRegister {
	switch {
	case !hasRow:
		return opRegister{}
	case stored.Status == "unfinished":
		return opRegister{begun: true, hash: stored.Hash}
	}
	return opRegister{begun: true, hash: stored.Hash, written: true, finisher: stored.Finisher, refused: stored.Refused}
}

// linearizableOp runs porcupine over one operation key's history, closed by
// the stored row as an observation after every call. A Resume that failed
// is left out, since it can neither begin nor finish an operation; a Run
// that failed stays in, since it may have begun one, and a Run that ended
// Executed or Unknown is two operations, its beginning (opBegin) and its
// answer, since calls between them may see the operation unfinished. An answer that no call
// could have stored is found before the search, which would otherwise try
// every order of the history to refute it.
func linearizableOp(history []*OpCall, stored OpStored, hasRow bool, timeout time.Duration) porcupine.CheckResult {
	final := registerOf(stored, hasRow)
	writes := map[int64]bool{}
	for _, c := range history {
		if c.Kind == Executed || c.Kind == Unknown {
			writes[c.Op] = true
		}
	}
	for _, c := range history {
		if c.Kind == Replayed && c.Value != 0 && !writes[c.Value] {
			return porcupine.Illegal
		}
	}
	if final.written && !writes[final.finisher] {
		return porcupine.Illegal
	}
	var last int64
	for _, c := range history {
		last = max(last, c.End)
	}
	ops := make([]porcupine.Operation, 0, len(history)+1)
	for _, c := range history {
		if c.Kind == Failed && c.Hash == "" {
			continue
		}
		end := c.End
		if c.Kind == Unknown {
			end = last + 1 // it may take effect up to the final observation
		}
		ops = append(ops, porcupine.Operation{ClientId: c.Client, Input: c, Call: c.Start, Return: end})
		if c.Hash != "" && (c.Kind == Executed || c.Kind == Unknown) {
			ops = append(ops, porcupine.Operation{ClientId: c.Client, Input: opBegin{c}, Call: c.Start, Return: end})
		}
	}
	ops = append(ops, porcupine.Operation{Input: opObservation{final}, Call: last + 2, Return: last + 3})
	return porcupine.CheckOperationsTimeout(opModel, ops, timeout)
}

// reconcileOp compares one operation key's history with what the database
// and the provider hold.
func reconcileOp(key string, history []*OpCall, ops map[int64]*OpCall, final OpFinal, effects []Effect) []Violation {
	var v []Violation
	add := func(op int64, format string, args ...any) {
		v = append(v, Violation{Key: key, Op: op, What: fmt.Sprintf(format, args...)})
	}
	stored, hasRow := final.Keys[key]
	finished := hasRow && stored.Status != "unfinished"
	ledger := final.Ledger[key]
	for _, step := range slices.Sorted(maps.Keys(ledger)) {
		for _, op := range ledger[step] {
			if c := ops[op]; c == nil || c.Key != key {
				add(op, "a row of step %s committed for a call that did not call this key", step)
			}
		}
	}
	for _, e := range effects {
		if final.Derived != nil && e.DerivedKey != final.Derived(key) {
			add(e.Op, "the provider's effect %s was made under the idempotency key %s, not the operation's derived key %s", e.ID, e.DerivedKey, final.Derived(key))
		}
	}
	switch {
	case !hasRow:
		if len(ledger) > 0 {
			add(0, "step rows %v committed, yet the key holds nothing", ledger)
		}
		if len(effects) > 0 {
			add(0, "%d effects at the provider, yet the key holds nothing", len(effects))
		}
	case !finished:
		add(0, "the operation was left unfinished after it was settled")
	default:
		steps := setOf(ledger)
		maps.Copy(steps, setOf(stored.Steps))
		for _, step := range slices.Sorted(maps.Keys(steps)) {
			rows := ledger[step]
			want, named := stored.Steps[step]
			switch {
			case !named && len(rows) > 0:
				add(0, "step %s committed rows (calls %v) that the answer does not name", step, rows)
			case named && len(rows) != 1:
				add(0, "%d rows of step %s committed (calls %v): the step ran other than once", len(rows), step, rows)
			case named && rows[0] != want:
				add(rows[0], "the row of step %s names call %d, the answer call %d", step, rows[0], want)
			}
		}
		ids := make([]string, 0, len(effects))
		for _, e := range effects {
			ids = append(ids, e.ID)
		}
		switch {
		case stored.Effect == "" && len(effects) > 0:
			add(0, "effects %v at the provider, which the answer does not name", ids)
		case stored.Effect != "" && len(effects) != 1:
			add(0, "%d effects at the provider for one operation (%v): the external step acted other than once", len(effects), ids)
		case stored.Effect != "" && effects[0].ID != stored.Effect:
			add(0, "the provider's effect is %s, the answer names %s", effects[0].ID, stored.Effect)
		}
		for _, step := range slices.Sorted(maps.Keys(stored.Outputs)) {
			if op := stored.Outputs[step]; final.Fenced[step][op] {
				add(op, "the output of step %s was recorded from an owner that had lost its lease", step)
			}
		}
		c := ops[stored.Finisher]
		switch {
		case c == nil:
			add(stored.Finisher, "the answer was stored by a call that no client made")
		case c.Key != key:
			add(stored.Finisher, "the answer was stored by a call of key %s", c.Key)
		case c.Kind == Failed:
			add(stored.Finisher, "stored the answer, but the call reported a plain failure: %s", c.Err)
		case c.Kind != Executed && c.Kind != Unknown:
			add(stored.Finisher, "stored the answer, but the call reported %s", c.Kind)
		case c.Hash != "" && c.Hash != stored.Hash:
			add(stored.Finisher, "stored for request %s, but the call's request was %s", stored.Hash, c.Hash)
		}
	}
	for _, c := range history {
		switch {
		case c.Kind == Executed && (!finished || stored.Finisher != c.Op):
			add(c.Op, "the call reported that it stored the answer, which is not the stored one")
		case c.Kind == Replayed && (!finished || c.Value != 0 && stored.Finisher != c.Value):
			add(c.Op, "replayed the answer of op %d, but the stored answer is another", c.Value)
		case c.Kind == Mismatch && hasRow && stored.Hash == c.Hash:
			add(c.Op, "ErrMismatch, but the key's request is the call's own")
		}
		if c.Answer != "" && finished && c.Answer != stored.Answer {
			add(c.Op, "returned the answer %s, but the stored answer is %s", c.Answer, stored.Answer)
		}
	}
	return v
}

// describeOp summarises an operation key's history for a violation's
// message.
func describeOp(history []*OpCall, stored OpStored, hasRow bool) string {
	byKind := map[Kind]int{}
	resumes := 0
	for _, c := range history {
		byKind[c.Kind]++
		if c.Hash == "" {
			resumes++
		}
	}
	s := fmt.Sprintf("%d calls, %d of them Resume (", len(history), resumes)
	for i, k := range Kinds {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s %d", k, byKind[k])
	}
	return s + "), stored " + registerOf(stored, hasRow).String()
}
