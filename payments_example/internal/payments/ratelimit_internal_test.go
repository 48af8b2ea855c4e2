package payments

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"
)

// TestPerAccountBuckets pins the limiter's arithmetic on a clock of its
// own: a burst, then one payment per 1/rate, each account on its own
// bucket, a refusal that takes no token, and idle buckets forgotten only
// once they are full again.
func TestPerAccountBuckets(t *testing.T) {
	t.Parallel()
	limits, err := newPerAccount(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if limits.rate != DefaultPaymentRate || limits.burst != DefaultPaymentBurst {
		t.Fatalf("defaults %v/%d, want %v/%d", limits.rate, limits.burst, DefaultPaymentRate, DefaultPaymentBurst)
	}
	t0 := time.Unix(1_800_000_000, 0)
	a, b := uuid.New(), uuid.New()
	for i := range DefaultPaymentBurst {
		if d := limits.wait(a, t0); d != 0 {
			t.Fatalf("payment %d of the burst refused for %v", i+1, d)
		}
	}
	step := time.Duration(float64(time.Second) / float64(DefaultPaymentRate))
	for range 3 { // refused, and refusing takes nothing: the wait stays the same
		if d := limits.wait(a, t0); d != step {
			t.Fatalf("beyond the burst: wait %v, want %v", d, step)
		}
	}
	if d := limits.wait(b, t0); d != 0 {
		t.Fatalf("another account refused for %v", d)
	}
	if d := limits.wait(a, t0.Add(step)); d != 0 {
		t.Fatalf("after 1/rate: refused for %v", d)
	}
	if d := limits.wait(a, t0.Add(step)); d != step {
		t.Fatalf("a second payment after 1/rate: wait %v, want %v", d, step)
	}

	// a is busy (its bucket is empty), b has been idle long enough to be
	// full again: a sweep keeps a and drops b.
	limits.sweep(t0.Add(step))
	if _, ok := limits.limiters[a]; !ok {
		t.Fatal("the sweep dropped a busy account's bucket")
	}
	if _, ok := limits.limiters[b]; ok {
		t.Fatal("the sweep kept a bucket that is full again")
	}

	if _, err := newPerAccount(-1, 0); err == nil {
		t.Error("a negative rate accepted")
	}
	unlimited, err := newPerAccount(rate.Inf, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		if d := unlimited.wait(a, t0); d != 0 {
			t.Fatalf("rate.Inf refused for %v", d)
		}
	}
	if len(unlimited.limiters) != 0 {
		t.Fatal("rate.Inf keeps buckets")
	}
}
