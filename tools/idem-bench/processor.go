package main

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// processor is the fake card processor of the -operations mode, in
// process: a charge takes latency, at most limit charges are served at
// once (the others queue for a slot, as a provider's concurrency limit
// makes them), and it honours idempotency keys as Stripe does: the first
// call with a key charges, every later call with that key returns the
// same charge and counts as a repeat.
type processor struct {
	// latency is set between measurements, never while calls run.
	latency time.Duration
	limit   int
	slots   chan struct{} // nil: no limit

	mu      sync.Mutex
	charges map[string]string // idempotency key -> charge id

	calls, repeats   atomic.Int64
	inFlight, peakIn atomic.Int64
}

func newProcessor(limit int) *processor {
	p := &processor{limit: limit, charges: map[string]string{}}
	if limit > 0 {
		p.slots = make(chan struct{}, limit)
	}
	return p
}

// Charge charges amount under key, or returns the charge key already made.
// It fails, having charged nothing, when ctx ends before the charge.
func (p *processor) Charge(ctx context.Context, key string, amount int64) (string, error) {
	p.calls.Add(1)
	if p.slots != nil {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		defer func() { <-p.slots }()
	}
	n := p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	for {
		peak := p.peakIn.Load()
		if n <= peak || p.peakIn.CompareAndSwap(peak, n) {
			break
		}
	}
	if p.latency > 0 {
		t := time.NewTimer(p.latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.charges[key]
	if ok {
		p.repeats.Add(1)
		return id, nil
	}
	id = "ch_" + strconv.Itoa(len(p.charges)+1)
	p.charges[key] = id
	return id, nil
}

// procStats is what the processor saw over one measurement.
type procStats struct {
	charges, repeats int64
	peak             int64 // most charges served at once
}

// reset starts a measurement at latency d.
func (p *processor) reset(d time.Duration) {
	p.latency = d
	p.peakIn.Store(0)
	p.repeats.Store(0)
	p.calls.Store(0)
	p.mu.Lock()
	clear(p.charges)
	p.mu.Unlock()
}

func (p *processor) stats() procStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return procStats{charges: int64(len(p.charges)), repeats: p.repeats.Load(), peak: p.peakIn.Load()}
}

// limitText names the processor's concurrency limit.
func (p *processor) limitText() string {
	if p.limit <= 0 {
		return "unlimited"
	}
	return strconv.Itoa(p.limit)
}
