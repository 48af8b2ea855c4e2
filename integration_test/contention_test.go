package integration_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// contentionBound bounds every call that meets a key held by another
// transaction. Such a call is answered at once (ErrInProgress), in
// milliseconds even on a loaded machine; a call that waited for the holder
// instead (a claim without its advisory lock waits on the holder's row)
// would hang the test, since the holder here ends only after the call
// returns. The bound turns that hang into a failure within seconds.
const contentionBound = 10 * time.Second

// stormBound bounds a storm of calls on one key, all of which must be
// answered while the first holds it.
const stormBound = 30 * time.Second

// contended returns a context for a call that meets a busy key.
func contended(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), contentionBound)
	t.Cleanup(cancel)
	return ctx
}

// holderRelease returns the channel a call holding a key waits on inside
// fn, and the function that closes it. The function also runs when t ends:
// a test that fails while a holder waits must not leave it, and its
// connection, behind, or closing the test's pool would wait forever.
func holderRelease(t *testing.T) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	release := sync.OnceFunc(func() { close(ch) })
	t.Cleanup(release)
	return ch, release
}

// waitedForHolder explains a contended call's error when it is the bound's.
func waitedForHolder(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return " (the call waited for the key's holder instead of answering at once: does the statement still take, and heed, the key's advisory lock?)"
	}
	return ""
}
