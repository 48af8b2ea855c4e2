// Package holdkeys holds idem keys in progress for tests that observe keys
// in progress from outside (Client.Stats, the idemotel gauges).
package holdkeys

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// Hold starts n calls through keys, with keys prefix-0 … prefix-(n-1), whose
// work waits until the returned release is called (or the test ends). It
// returns once every claim is held. release is safe to call more than once
// and returns once every call has ended; a call that fails fails t.
func Hold(t testing.TB, keys *idem.Client, prefix string, n int) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	var entered, done sync.WaitGroup
	entered.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			_, err := idem.Do(context.Background(), keys, fmt.Sprintf("%s-%d", prefix, i), "h", func(pgx.Tx) (int, error) {
				entered.Done()
				<-gate
				return i, nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	entered.Wait()
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(gate)
			done.Wait()
		})
	}
	t.Cleanup(release)
	return release
}
