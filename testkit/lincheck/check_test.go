package lincheck

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// at builds a call of key "k" with hash "h" over [start, end].
func at(op int64, kind Kind, value int64, start, end int64) Call {
	return Call{Key: "k", Hash: "h", Op: op, Kind: kind, Value: value, Start: start, End: end}
}

func TestCheck(t *testing.T) {
	done := func(op int64) Final {
		return Final{Keys: map[string]Stored{"k": {Status: "completed", Hash: "h", Op: op}},
			Ledger: map[string][]int64{"k": {op}}}
	}
	empty := Final{}
	for _, c := range []struct {
		name  string
		calls []Call
		final Final
		want  []string // a substring of each violation, in order; none: clean
	}{
		{
			name: "every kind, consistent",
			calls: []Call{
				at(1, Failed, 0, 0, 5),
				at(2, InProgress, 0, 1, 6),
				at(3, Executed, 3, 2, 10),
				at(4, Replayed, 3, 11, 20),
				{Key: "k", Hash: "other", Op: 5, Kind: Mismatch, Start: 12, End: 21},
				at(6, Unknown, 0, 13, 22),
			},
			final: done(3),
		},
		{
			name:  "an unknown call that committed, replayed later",
			calls: []Call{at(1, Unknown, 0, 0, 10), at(2, Replayed, 1, 20, 30)},
			final: done(1),
		},
		{
			name:  "an unknown call that did not commit",
			calls: []Call{at(1, Unknown, 0, 0, 10), at(2, InProgress, 0, 20, 30)},
			final: empty,
		},
		{
			name:  "a plain failure that committed",
			calls: []Call{{Key: "k", Hash: "h", Op: 1, Kind: Failed, Err: "idem: commit: FATAL", Start: 0, End: 10}, at(2, Replayed, 1, 20, 30)},
			final: done(1),
			want:  []string{"not linearizable", "committed, but the call reported a plain failure: idem: commit: FATAL"},
		},
		{
			name:  "a plain failure that committed, never observed",
			calls: []Call{at(1, Failed, 0, 0, 10)},
			final: done(1),
			want:  []string{"not linearizable", "committed, but the call reported a plain failure"},
		},
		{
			name:  "two executions",
			calls: []Call{at(1, Executed, 1, 0, 10), at(2, Executed, 2, 5, 15)},
			final: Final{Keys: map[string]Stored{"k": {Status: "completed", Hash: "h", Op: 2}},
				Ledger: map[string][]int64{"k": {1, 2}}},
			want: []string{"not linearizable", "2 ledger rows", "its own execution, which did not commit"},
		},
		{
			name:  "two rows of one key, one of them a refusal",
			calls: []Call{at(1, Executed, 1, 0, 10), {Key: "k", Hash: "h", Op: 2, Kind: Executed, Value: 2, Refused: true, Start: 5, End: 15}},
			final: Final{Keys: map[string]Stored{"k": {Status: "completed", Hash: "h", Op: 1}},
				Rows: map[string]int{"k": 2}, Ledger: map[string][]int64{"k": {1}}},
			want: []string{"not linearizable", "2 rows in the key table", "its own execution, which did not commit"},
		},
		{
			name:  "in progress after the key completed",
			calls: []Call{at(1, Executed, 1, 0, 10), at(2, InProgress, 0, 20, 30)},
			final: done(1),
			want:  []string{"not linearizable"},
		},
		{
			name:  "a mismatch for the stored hash",
			calls: []Call{at(1, Executed, 1, 0, 10), at(2, Mismatch, 0, 20, 30)},
			final: done(1),
			want:  []string{"not linearizable", "ErrMismatch, but the stored request hash is the call's own"},
		},
		{
			name:  "a lost write",
			calls: []Call{at(1, Executed, 1, 0, 10)},
			final: empty,
			want:  []string{"not linearizable", "its own execution, which did not commit"},
		},
		{
			name:  "a refusal whose writes committed",
			calls: []Call{{Key: "k", Hash: "h", Op: 1, Kind: Executed, Value: 1, Refused: true, End: 10}},
			final: Final{Keys: map[string]Stored{"k": {Status: "refused", Hash: "h", Op: 1, Refused: true}},
				Ledger: map[string][]int64{"k": {1}}},
			want: []string{"committed a refusal, yet ledger rows"},
		},
		{
			name:  "a key left in progress, and a row of nobody's",
			calls: []Call{at(1, Failed, 0, 0, 10)},
			final: Final{Keys: map[string]Stored{"k": {Status: "in_progress", Hash: "h"}},
				Ledger: map[string][]int64{"k": {9}}},
			want: []string{"no call made", "left 'in_progress'"},
		},
		{
			name:  "a contradiction seen at the return",
			calls: []Call{{Key: "k", Hash: "h", Op: 1, Kind: Failed, Contradiction: "ErrKeyLost", End: 10}},
			final: empty,
			want:  []string{"ErrKeyLost"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := Check(c.calls, c.final, 10*time.Second)
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
