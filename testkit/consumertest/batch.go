package consumertest

import (
	"context"
	"math/rand/v2"

	"github.com/idemhq/idem/idemconsume"
)

// batchKiller is a killer's Processor of one instance when the processor
// under test processes batches too (idemconsume.BatchProcessor): the
// instance is killed in the first handler of a batch, or at the ack of one
// of its messages, with the chances and budgets of a single delivery.
type batchKiller struct {
	k    *killer
	one  idemconsume.Processor
	bp   idemconsume.BatchProcessor
	kill context.CancelFunc
}

// Process is the killer's single delivery.
func (b *batchKiller) Process(ctx context.Context, m *idemconsume.Message, s idemconsume.Settler) (idemconsume.Result, error) {
	return b.one.Process(ctx, m, s)
}

func (b *batchKiller) ProcessBatch(ctx context.Context, ms []*idemconsume.Message, settle func(i int) idemconsume.Settler) ([]idemconsume.Result, []error) {
	k := b.k
	killAt := -1
	for i, m := range ms {
		if Poisoned(string(m.Payload)) {
			continue
		}
		if rand.IntN(8) == 0 && k.inHandler.Add(-1) >= 0 {
			ctx = context.WithValue(ctx, killKey{}, b.kill)
		}
		if killAt < 0 && rand.IntN(8) == 0 && k.afterCommit.Add(-1) >= 0 {
			killAt = i
		}
	}
	res, errs := b.bp.ProcessBatch(ctx, ms, func(i int) idemconsume.Settler {
		s := &settler{Settler: settle(i)}
		if i == killAt {
			s.kill = b.kill
		}
		return s
	})
	for i, r := range res {
		if r.Action == idemconsume.DeadLetter && !Poisoned(string(ms[i].Payload)) {
			k.t.Logf("%s dead-lettered on delivery %d: %v", ms[i].Payload, ms[i].Deliveries, r.Err)
		}
		if errs[i] == nil && (r.Action == idemconsume.Ack || r.Action == idemconsume.DeadLetter) {
			k.settled.Add(1)
		}
	}
	return res, errs
}
