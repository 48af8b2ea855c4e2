package kit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// NewKey returns a new idempotency key: a random UUID, as clients send.
func NewKey() string { return uuid.NewString() }

// Keys records the keys a kit sent, for the clean-up.
type Keys struct {
	mu   sync.Mutex
	keys []string
}

// New returns a new key and records it.
func (k *Keys) New() string {
	key := NewKey()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = append(k.keys, key)
	return key
}

// All returns the recorded keys.
func (k *Keys) All() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}

// CleanupContext returns a context for clean-up work at the end of t: t's
// context is cancelled by then.
func CleanupContext(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
}

// Settle is how long the kits keep retrying a request whose key is still
// in progress before they report it: a bound for a hung service, not a
// timing assertion.
const Settle = 30 * time.Second
