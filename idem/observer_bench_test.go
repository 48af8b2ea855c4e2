package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// BenchmarkObserver measures what the Observer hook costs: the same calls
// on a Client without an observer and on one with a no-op observer, side by
// side. The allocations per call must be equal (TestObserverAllocatesNothing
// asserts it); the package idemotel benchmarks its own observer.
//
//	go test -run '^$' -bench Observer -benchmem ./idem/
func BenchmarkObserver(b *testing.B) {
	for _, o := range []struct {
		name string
		obs  idem.Observer
	}{
		{"none", nil},
		{"noop", noopObserver{}},
	} {
		b.Run("replay/observer="+o.name, func(b *testing.B) {
			ctx := context.Background()
			keys := observedClient(b, o.obs)
			ran := errors.New("fn ran on a replay")
			_, err := idem.Do(ctx, keys, "replayed", benchHash, func(tx pgx.Tx) (benchReceipt, error) {
				return benchWork(ctx, tx, 1)
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				_, err := idem.Do(ctx, keys, "replayed", benchHash, func(pgx.Tx) (benchReceipt, error) {
					return benchReceipt{}, ran
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("execute/observer="+o.name, func(b *testing.B) {
			ctx := context.Background()
			keys := observedClient(b, o.obs)
			names := benchKeys("do-", 1<<20)
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				account := int64(1 + i%benchAccounts)
				_, err := idem.Do(ctx, keys, names[i%len(names)], benchHash, func(tx pgx.Tx) (benchReceipt, error) {
					return benchWork(ctx, tx, account)
				})
				if err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

func observedClient(b *testing.B, obs idem.Observer) *idem.Client {
	b.Helper()
	keys, err := idem.NewClient(benchPool(b), &idem.Config{Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	return keys
}
