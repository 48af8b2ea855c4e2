package lincheck

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// opAt builds a call of operation key "k" over [start, end]: a Run with
// request hash, or a Resume when hash is "".
func opAt(op int64, hash string, kind Kind, value int64, start, end int64) OpCall {
	c := OpCall{Call: Call{Key: "k", Hash: hash, Op: op, Kind: kind, Value: value, Start: start, End: end}}
	if hash != "" && (kind == Executed || kind == Replayed) {
		c.Answer = answerOf(value)
	}
	return c
}

func answerOf(op int64) string { return fmt.Sprintf("answer of op %d", op) }

func derived(key string) string { return "derived-" + key }

// finishedBy is the settled state of key "k", finished by op with request
// "h": reserve run by reserveOp, receipt by op, one effect e1.
func finishedBy(op, reserveOp int64) OpFinal {
	return OpFinal{
		Keys: map[string]OpStored{"k": {Status: "completed", Hash: "h", Finisher: op, Answer: answerOf(op),
			Steps: map[string]int64{"reserve": reserveOp, "receipt": op}, Effect: "e1"}},
		Ledger:  map[string]map[string][]int64{"k": {"reserve": {reserveOp}, "receipt": {op}}},
		Effects: []Effect{{Key: "k", DerivedKey: derived("k"), ID: "e1", Op: reserveOp}},
		Derived: derived,
	}
}

func TestCheckOperations(t *testing.T) {
	for _, c := range []struct {
		name  string
		calls []OpCall
		final func() OpFinal
		want  []string // a substring of each violation, in order; none: clean
	}{
		{
			name: "every kind, consistent",
			calls: []OpCall{
				opAt(1, "", NotFound, 0, 0, 1),
				opAt(2, "h", Failed, 0, 2, 10), // began, ran reserve, failed at the provider
				opAt(3, "h", InProgress, 0, 3, 4),
				opAt(4, "other", Mismatch, 0, 11, 12), // while unfinished
				opAt(5, "h", Executed, 5, 13, 20),
				opAt(6, "h", Replayed, 5, 21, 22),
				opAt(7, "", Replayed, 0, 23, 24),
				opAt(8, "h", Unknown, 0, 14, 25),
				opAt(9, "", InProgress, 0, 15, 16),
			},
			final: func() OpFinal { return finishedBy(5, 2) },
		},
		{
			name:  "Resume finishes what a failed call began",
			calls: []OpCall{opAt(1, "h", Failed, 0, 0, 10), opAt(2, "", Executed, 2, 20, 30)},
			final: func() OpFinal { return finishedBy(2, 1) },
		},
		{
			name:  "an unknown call that stored, replayed later",
			calls: []OpCall{opAt(1, "h", Unknown, 0, 0, 10), opAt(2, "h", Replayed, 1, 20, 30)},
			final: func() OpFinal { return finishedBy(1, 1) },
		},
		{
			name:  "a Resume of a key never begun",
			calls: []OpCall{opAt(1, "h", Failed, 0, 0, 10), opAt(2, "", NotFound, 0, 20, 30)},
			final: func() OpFinal { return OpFinal{Derived: derived} },
		},
		{
			name:  "a Resume between the beginning and the answer of one Run",
			calls: []OpCall{opAt(1, "h", Executed, 1, 0, 100), opAt(2, "", InProgress, 0, 10, 20), opAt(3, "", Replayed, 0, 110, 120)},
			final: func() OpFinal { return finishedBy(1, 1) },
		},
		{
			name:  "a Resume that saw an operation before any call began it",
			calls: []OpCall{opAt(1, "", InProgress, 0, 0, 5), opAt(2, "h", Executed, 2, 10, 20)},
			final: func() OpFinal { return finishedBy(2, 2) },
			want:  []string{"not linearizable"},
		},
		{
			name: "a plain failure that stored the answer",
			calls: []OpCall{{Call: Call{Key: "k", Hash: "h", Op: 1, Kind: Failed, Err: "idem: lease lost", End: 10}},
				opAt(2, "h", Replayed, 1, 20, 30)},
			final: func() OpFinal { return finishedBy(1, 1) },
			want:  []string{"not linearizable", "stored the answer, but the call reported a plain failure: idem: lease lost"},
		},
		{
			name:  "the external step acted twice",
			calls: []OpCall{opAt(1, "h", Failed, 0, 0, 10), opAt(2, "h", Executed, 2, 20, 30)},
			final: func() OpFinal {
				f := finishedBy(2, 1)
				f.Effects = append(f.Effects, Effect{Key: "k", DerivedKey: "random", ID: "e2", Op: 2})
				return f
			},
			want: []string{"under the idempotency key random, not the operation's derived key", "2 effects at the provider for one operation"},
		},
		{
			name:  "two effects under one derived key",
			calls: []OpCall{opAt(1, "h", Executed, 1, 0, 10)},
			final: func() OpFinal {
				f := finishedBy(1, 1)
				f.Effects = append(f.Effects, Effect{Key: "k", DerivedKey: derived("k"), ID: "e2", Op: 1})
				return f
			},
			want: []string{"2 effects at the provider for one operation", "2 effects under the one idempotency key"},
		},
		{
			name:  "a database step that ran twice",
			calls: []OpCall{opAt(1, "h", Failed, 0, 0, 10), opAt(2, "h", Executed, 2, 5, 30)},
			final: func() OpFinal {
				f := finishedBy(2, 2)
				f.Ledger["k"]["reserve"] = []int64{1, 2}
				return f
			},
			want: []string{"2 rows of step reserve"},
		},
		{
			name: "a refusal with a row of a step it does not name",
			calls: []OpCall{{Call: Call{Key: "k", Hash: "h", Op: 1, Kind: Executed, Value: 1, Refused: true, End: 10},
				Answer: answerOf(1)}},
			final: func() OpFinal {
				f := finishedBy(1, 1)
				s := f.Keys["k"]
				s.Status, s.Refused = "refused", true
				delete(s.Steps, "receipt")
				f.Keys["k"] = s
				return f
			},
			want: []string{"step receipt committed rows (calls [1]) that the answer does not name"},
		},
		{
			name:  "a step recorded from an owner that had lost its lease",
			calls: []OpCall{opAt(1, "h", Failed, 0, 0, 10), opAt(2, "h", Executed, 2, 5, 30)},
			final: func() OpFinal {
				f := finishedBy(2, 2)
				s := f.Keys["k"]
				s.Outputs = map[string]int64{"reserve": 2, "charge": 1, "receipt": 2}
				f.Keys["k"] = s
				f.Fenced = map[string]map[int64]bool{"charge": {1: true}, "reserve": {1: true}}
				return f
			},
			want: []string{"the output of step charge was recorded from an owner that had lost its lease"},
		},
		{
			name:  "a returned answer that is not the stored one",
			calls: []OpCall{opAt(1, "h", Executed, 1, 0, 10), {Call: Call{Key: "k", Hash: "h", Op: 2, Kind: Replayed, Value: 1, Start: 20, End: 30}, Answer: "forged"}},
			final: func() OpFinal { return finishedBy(1, 1) },
			want:  []string{"returned the answer forged"},
		},
		{
			name: "another request finished a begun operation",
			calls: []OpCall{opAt(1, "h", Failed, 0, 0, 10), opAt(2, "other", Mismatch, 0, 12, 15),
				{Call: Call{Key: "k", Hash: "other", Op: 3, Kind: Executed, Value: 3, Start: 20, End: 30}, Answer: answerOf(3)}},
			final: func() OpFinal {
				f := finishedBy(3, 1)
				s := f.Keys["k"]
				s.Hash = "other"
				f.Keys["k"] = s
				return f
			},
			want: []string{"not linearizable", "ErrMismatch, but the key's request is the call's own"},
		},
		{
			name:  "a replay of an answer nobody stored",
			calls: []OpCall{opAt(1, "h", InProgress, 0, 0, 10), opAt(2, "h", Replayed, 1, 20, 30)},
			final: func() OpFinal { return finishedBy(1, 1) },
			want:  []string{"not linearizable", "stored the answer, but the call reported in_progress"},
		},
		{
			name:  "not found after the answer was stored",
			calls: []OpCall{opAt(1, "h", Executed, 1, 0, 10), opAt(2, "", NotFound, 0, 20, 30)},
			final: func() OpFinal { return finishedBy(1, 1) },
			want:  []string{"not linearizable"},
		},
		{
			name:  "left unfinished",
			calls: []OpCall{opAt(1, "h", Failed, 0, 0, 10)},
			final: func() OpFinal {
				return OpFinal{Keys: map[string]OpStored{"k": {Status: "unfinished", Hash: "h"}},
					Ledger:  map[string]map[string][]int64{"k": {"reserve": {1}}},
					Derived: derived, Unfinished: 1, StepRecords: 1}
			},
			want: []string{"left unfinished", "Stats reports 1 unfinished", "1 step records left"},
		},
		{
			name:  "rows and effects of a key that holds nothing",
			calls: []OpCall{opAt(1, "h", Failed, 0, 0, 10)},
			final: func() OpFinal {
				return OpFinal{Ledger: map[string]map[string][]int64{"k": {"reserve": {1}}},
					Effects: []Effect{{Key: "k", DerivedKey: derived("k"), ID: "e1", Op: 1}}, Derived: derived}
			},
			want: []string{"step rows", "1 effects at the provider, yet the key holds nothing"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := CheckOperations(c.calls, c.final(), 10*time.Second)
			if len(r.Inconclusive) > 0 {
				t.Fatalf("inconclusive: %v", r.Inconclusive)
			}
			if len(r.Violations) != len(c.want) {
				t.Fatalf("violations %v; want %d matching %q", r.Violations, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(r.Violations[i].String(), w) {
					t.Errorf("violation %d: %v; want it to say %q", i, r.Violations[i], w)
				}
			}
		})
	}
}
