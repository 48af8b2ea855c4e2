package idemconsume_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/internal/consumertest"
	"github.com/idemhq/idem/internal/testdb"
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
