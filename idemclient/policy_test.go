package idemclient_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem/idemclient"
)

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		p    *idemclient.Policy
		ok   bool
	}{
		{"nil", nil, true},
		{"zero", &idemclient.Policy{}, true},
		{"v7", &idemclient.Policy{UUIDVersion: 7}, true},
		{"v5", &idemclient.Policy{UUIDVersion: 5}, false},
		{"negative attempts", &idemclient.Policy{MaxAttempts: -1}, false},
		{"negative backoff", &idemclient.Policy{MinBackoff: -time.Second}, false},
		{"negative MaxRetryAfter", &idemclient.Policy{MaxRetryAfter: -time.Second}, false},
		{"min above max", &idemclient.Policy{MinBackoff: time.Minute}, false},
	} {
		err := tt.p.Validate()
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, idemclient.ErrInvalidPolicy)) {
			t.Errorf("%s: Validate() = %v, want ok %v", tt.name, err, tt.ok)
		}
	}
	if _, err := idemclient.NewTransport(nil, &idemclient.Policy{UUIDVersion: 1}); !errors.Is(err, idemclient.ErrInvalidPolicy) {
		t.Errorf("NewTransport with an invalid policy: %v", err)
	}
}

// TestNext: the backoff doubles from MinBackoff up to MaxBackoff within its
// jitter, a longer hint wins, and Next says no once the attempts are spent,
// a hint is over MaxRetryAfter, or the wait would pass the deadline.
func TestNext(t *testing.T) {
	t.Parallel()
	p := &idemclient.Policy{MaxAttempts: 6, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, MaxRetryAfter: 10 * time.Second}
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 9: time.Second} {
		for range 50 {
			if got := p.Backoff(n); got < want/2 || got > want {
				t.Fatalf("Backoff(%d) = %v, want within [%v, %v]", n, got, want/2, want)
			}
		}
	}
	ctx := context.Background()
	if w, ok := p.Next(ctx, 1, 3*time.Second); !ok || w != 3*time.Second {
		t.Errorf("Next with a 3s hint = %v, %v; want the hint", w, ok)
	}
	if _, ok := p.Next(ctx, 6, 0); ok {
		t.Error("Next after MaxAttempts attempts: want no retry")
	}
	if _, ok := p.Next(ctx, 1, 11*time.Second); ok {
		t.Error("Next with a hint over MaxRetryAfter: want no retry")
	}
	short, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	if _, ok := (&idemclient.Policy{MaxRetryAfter: 2 * time.Hour}).Next(short, 1, 90*time.Minute); ok {
		t.Error("Next with a hint past the deadline: want no retry")
	}
}

func TestNewKey(t *testing.T) {
	t.Parallel()
	for _, v := range []int{0, 4, 7} {
		p := &idemclient.Policy{UUIDVersion: v}
		a, _ := p.NewKey()
		b, _ := p.NewKey()
		want := byte('4')
		if v == 7 {
			want = '7'
		}
		if len(a) != 36 || a[14] != want || a == b {
			t.Errorf("UUIDVersion %d: keys %q, %q", v, a, b)
		}
	}
}
