package integration_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// TestFaultCommitEveryProtocol loses COMMIT's answer, or follows it with a
// FATAL, on the pipeline's other two protocols (TestFaultWire plays the
// default one and the outer transaction): insertProtocol, at REPEATABLE
// READ, and partitionedProtocol, on the partitioned layout. COMMIT's own
// reply decides: confirmed is success, no reply is ErrOutcomeUnknown; the
// retry replays what committed.
func TestFaultCommitEveryProtocol(t *testing.T) {
	protocols := []struct {
		name        string
		partitioned bool
		opts        []idem.Option
	}{
		{"insert", false, []idem.Option{idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.RepeatableRead})}},
		{"partitioned", true, nil},
	}
	for _, p := range protocols {
		for _, f := range wireFaults {
			if !strings.HasPrefix(f.name, "d_") && !strings.HasPrefix(f.name, "e_") {
				continue
			}
			t.Run(p.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				l := newLedger(t)
				if p.partitioned {
					if err := replaceWithPartitioned(ctx, l.admin, "idempotency_keys", time.Hour); err != nil {
						t.Fatal(err)
					}
				}
				const key, account, amount = "k-fault", 1, 100
				work := chargeWork(ctx, key, account, amount, nil)
				pool := l.pool(func(c *pgxpool.Config) { c.MaxConns = 1 })
				// Warm: the faulty call sends only Bind and Execute.
				if _, err := idem.Do(ctx, pool, "k-warm", ledgerHash, chargeWork(ctx, "k-warm", 0, 1, nil), p.opts...); err != nil {
					t.Fatal(err)
				}
				l.proxy.SetRule(f.rule())
				first, err := idem.Do(ctx, pool, key, ledgerHash, work, p.opts...)
				l.proxy.SetRule(nil)
				if l.proxy.Cuts() != 1 {
					t.Fatalf("the fault fired %d times, want 1", l.proxy.Cuts())
				}
				if f.confirmed {
					if err != nil {
						t.Fatalf("Do: %v; COMMIT's reply confirmed the commit, so the call succeeded", err)
					}
				} else {
					unknown(t, err)
				}
				if f.committed {
					if keyRow, charges := l.committed(key); !keyRow || charges != 1 {
						t.Fatalf("key row %v, %d charges; the COMMIT reached the server", keyRow, charges)
					}
				} else {
					l.noTrace(key)
				}
				again, _, replayed := retryKey(t, pool, key, work)
				if replayed != f.committed {
					t.Fatalf("retry replayed %v, want %v", replayed, f.committed)
				}
				answers := []receipt{again}
				if err == nil {
					answers = append(answers, first)
				}
				l.exactlyOnce(key, account, amount, answers...)
			})
		}
	}
}
