package lincheck

import (
	"strings"
	"testing"
	"time"
)

// delivery builds a delivery of message "k" with payload hash "h" over
// [start, end].
func delivery(op int64, kind Kind, settled Settlement, start, end int64) Delivery {
	d := Delivery{Call: Call{Key: "k", Hash: "h", Op: op, Kind: kind, Start: start, End: end}, Settled: settled}
	if kind == Executed {
		d.Value = op
	}
	return d
}

func TestCheckDeliveries(t *testing.T) {
	consumed := func(effects ...int64) Final {
		return Final{Keys: map[string]Stored{"k": {Status: "completed", Hash: "h"}},
			Ledger: map[string][]int64{"k": effects}}
	}
	other := func(d Delivery) Delivery { d.Hash = "other"; return d }
	for _, c := range []struct {
		name       string
		deliveries []Delivery
		final      Final
		want       []string // a substring of each violation, in order; none: clean
	}{
		{
			name: "every settlement, consistent",
			deliveries: []Delivery{
				delivery(1, Failed, Retried, 0, 5),
				delivery(2, InProgress, Retried, 1, 6),
				delivery(3, Executed, Acked, 2, 10),
				delivery(4, Replayed, Acked, 11, 20),
				other(delivery(5, Mismatch, DeadLettered, 12, 21)),
				delivery(6, Unknown, Retried, 13, 22),
				delivery(7, Failed, Unsettled, 14, 23),
			},
			final: consumed(3),
		},
		{
			name:       "an unknown outcome that committed, acknowledged on redelivery",
			deliveries: []Delivery{delivery(1, Unknown, Retried, 0, 10), delivery(2, Replayed, Acked, 20, 30)},
			final:      consumed(1),
		},
		{
			name:       "an Ack before the commit: a later delivery finds the key in progress",
			deliveries: []Delivery{delivery(1, Executed, Acked, 0, 10), delivery(2, InProgress, Retried, 12, 20)},
			final:      consumed(1),
			want:       []string{"not linearizable"},
		},
		{
			name:       "an Ack whose effect never committed",
			deliveries: []Delivery{delivery(1, Executed, Acked, 0, 10)},
			final:      Final{},
			want:       []string{"not linearizable", "acknowledged as its own execution, which did not commit"},
		},
		{
			name:       "an effect committed twice",
			deliveries: []Delivery{delivery(1, Executed, Acked, 0, 10), delivery(2, Failed, Retried, 5, 15)},
			final:      consumed(1, 2),
			want:       []string{"reported a plain failure", "2 effect rows committed"},
		},
		{
			name:       "a duplicate acknowledged before any delivery wrote",
			deliveries: []Delivery{delivery(2, Replayed, Acked, 0, 5), delivery(1, Executed, Acked, 10, 20)},
			final:      consumed(1),
			want:       []string{"not linearizable"},
		},
		{
			name:       "another payload acknowledged as a duplicate",
			deliveries: []Delivery{delivery(1, Executed, Acked, 0, 10), other(delivery(2, Replayed, Acked, 20, 30))},
			final:      consumed(1),
			want:       []string{"not linearizable", "acknowledged as a duplicate, but the key does not hold its payload's result"},
		},
		{
			name:       "a failure acknowledged",
			deliveries: []Delivery{delivery(1, Failed, Acked, 0, 10)},
			final:      Final{},
			want:       []string{"settled ack, but Run's outcome was failed"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := CheckDeliveries(c.deliveries, c.final, 10*time.Second)
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
