package idemconsume_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/testkit/consumertest"
	"github.com/idemhq/idem/testkit/testdb"
)

// BenchmarkProcess compares, per message, the idem consumer with the bare
// at-least-once one (the same handler, one INSERT, in a plain transaction,
// acked after COMMIT), on one database, each message new; the broker's own
// cost, the same for both, is left out:
//
//	go test -run '^$' -bench Process -benchtime 3000x ./idemconsume
func BenchmarkProcess(b *testing.B) {
	pool := testdb.New(b)
	if _, err := pool.Exec(b.Context(), consumertest.EffectsSQL); err != nil {
		b.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ('bench', $1)", string(m.Payload))
		return err
	}
	c, err := idemconsume.New(pool, &idemconsume.Config{Name: "bench"}, h)
	if err != nil {
		b.Fatal(err)
	}
	// The two alternate, message by message, so that the load of a shared
	// machine falls on both alike; each reports its own time per message.
	procs := []idemconsume.Processor{c, &consumertest.Bare{DB: pool, Handler: h, Max: 3, Backoff: time.Millisecond}}
	var spent [2]time.Duration
	s := &settler{}
	i := 0
	for b.Loop() {
		i++
		for j, p := range procs {
			id := fmt.Sprintf("%d-%d-%d", j, b.N, i)
			start := time.Now()
			if res, err := p.Process(b.Context(), &idemconsume.Message{ID: id, Payload: []byte(id)}, s); err != nil || res.Action != idemconsume.Ack {
				b.Fatal(res, err)
			}
			spent[j] += time.Since(start)
			s.actions = s.actions[:0]
		}
	}
	b.ReportMetric(float64(spent[0].Nanoseconds())/float64(i), "ns/idem-msg")
	b.ReportMetric(float64(spent[1].Nanoseconds())/float64(i), "ns/bare-msg")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "idem-throughput/bare")
}

// BenchmarkProcessBatch compares, per message, the same handler as
// BenchmarkProcess in six ways, alternating round by round (a round is 50
// new messages for each) so that the load of a shared machine falls on all
// alike: bare and idem one transaction per message, idem batches of 10 and
// 50 (ProcessBatch), and bare batches of 10 and 50 (the messages in one
// plain transaction, without savepoints: one failure rolls back the batch).
// The ratios are throughputs against the bare consumer's in the same
// shape:
//
//	go test -run '^$' -bench ProcessBatch -benchtime 60x ./idemconsume
func BenchmarkProcessBatch(b *testing.B) {
	pool := testdb.New(b)
	if _, err := pool.Exec(b.Context(), consumertest.EffectsSQL); err != nil {
		b.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ('bench', $1)", string(m.Payload))
		return err
	}
	c, err := idemconsume.New(pool, &idemconsume.Config{Name: "bench"}, h)
	if err != nil {
		b.Fatal(err)
	}
	bare := &consumertest.Bare{DB: pool, Handler: h, Max: 3, Backoff: time.Millisecond}
	s := &settler{}
	settle := func(int) idemconsume.Settler { return s }
	perRecord := func(p idemconsume.Processor) func(ms []*idemconsume.Message) {
		return func(ms []*idemconsume.Message) {
			for _, m := range ms {
				if res, err := p.Process(b.Context(), m, s); err != nil || res.Action != idemconsume.Ack {
					b.Fatal(res, err)
				}
			}
		}
	}
	idemBatch := func(n int) func(ms []*idemconsume.Message) {
		return func(ms []*idemconsume.Message) {
			for i := 0; i < len(ms); i += n {
				res, errs := c.ProcessBatch(b.Context(), ms[i:i+n], settle)
				for j := range res {
					if errs[j] != nil || res[j].Action != idemconsume.Ack {
						b.Fatal(res[j], errs[j])
					}
				}
			}
		}
	}
	bareBatch := func(n int) func(ms []*idemconsume.Message) {
		return func(ms []*idemconsume.Message) {
			for i := 0; i < len(ms); i += n {
				err := pgx.BeginFunc(b.Context(), pool, func(tx pgx.Tx) error {
					for _, m := range ms[i : i+n] {
						if err := h(b.Context(), tx, m); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				for range n {
					_ = s.Ack(b.Context())
				}
			}
		}
	}
	modes := []struct {
		name string
		run  func(ms []*idemconsume.Message)
	}{
		{"bare", perRecord(bare)}, {"idem", perRecord(c)},
		{"bare-batch10", bareBatch(10)}, {"idem-batch10", idemBatch(10)},
		{"bare-batch50", bareBatch(50)}, {"idem-batch50", idemBatch(50)},
	}
	const round = 50
	spent := make([]time.Duration, len(modes))
	msgs := 0
	for b.Loop() {
		for j, mode := range modes {
			ms := make([]*idemconsume.Message, round)
			for i := range ms {
				id := fmt.Sprintf("%s-%d-%d-%d", mode.name, b.N, msgs, i)
				ms[i] = &idemconsume.Message{ID: id, Payload: []byte(id)}
			}
			start := time.Now()
			mode.run(ms)
			spent[j] += time.Since(start)
			s.actions = s.actions[:0]
		}
		msgs += round
	}
	for j, mode := range modes {
		b.ReportMetric(float64(spent[j].Nanoseconds())/float64(msgs), "ns/"+mode.name+"-msg")
	}
	ratio := func(num, den int) float64 { return float64(spent[den]) / float64(spent[num]) }
	b.ReportMetric(ratio(1, 0), "idem/bare")
	b.ReportMetric(ratio(3, 2), "idem-batch10/bare-batch10")
	b.ReportMetric(ratio(5, 4), "idem-batch50/bare-batch50")
	b.ReportMetric(ratio(3, 0), "idem-batch10/bare")
	b.ReportMetric(ratio(5, 0), "idem-batch50/bare")
}
