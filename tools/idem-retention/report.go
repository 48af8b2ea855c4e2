package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

func (r *result) print(o options) {
	fmt.Printf("%s table\n", r.layout)
	fmt.Printf("  %7s %8s %10s %10s %10s %10s %5s\n", "t", "cleanup", "keys", "size", "live", "dead", "parts")
	for _, s := range r.samples {
		c := "-"
		if s.cleanup {
			c = "on"
		}
		fmt.Printf("  %6.0fs %8s %10d %10s %10d %10d %5d\n", s.at.Seconds(), c, s.keys, mib(s.bytes), s.rows, s.dead, s.partitions)
	}
	rateA, rateB := r.rates()
	fmt.Printf("  Do/s without cleanup %.0f, with cleanup %.0f (ratio %.2f)\n", rateA, rateB, rateB/rateA)
	fmt.Printf("  WAL per key: %.0f B without cleanup, %.0f B with cleanup (incl. the sweeper and autovacuum)\n",
		float64(r.walA)/float64(max(r.keysA, 1)), float64(r.walB)/float64(max(r.keysB, 1)))
	if len(r.sweeps) > 0 {
		first := r.sweeps[0]
		fmt.Printf("  first sweep (the backlog of the phase without cleanup): removed %d keys in %v = %.0f keys/s (%.1f x the insert rate)\n",
			first.removed, first.took.Round(time.Millisecond), perSec(first.removed, first.took), perSec(first.removed, first.took)/rateB)
		busy, removed := r.steady()
		fmt.Printf("  later sweeps: %d, removed %d keys, busy %.1f%% of the time (%d failed)\n",
			len(r.sweeps)-1, removed, 100*busy, r.sweepErrs)
	}
	lo, hi := r.flat(o)
	fmt.Printf("  size in the last half of the cleanup phase: %s to %s (max/min %.2f)\n\n", mib(lo), mib(hi), float64(hi)/float64(max(lo, 1)))
}

// rates are Do calls per second without and with cleanup.
func (r *result) rates() (float64, float64) {
	return perSec(r.keysA, r.timeA), perSec(r.keysB, r.timeB)
}

// steady is the share of the time the sweeper was busy after its first
// run, and what it removed then.
func (r *result) steady() (busy float64, removed int64) {
	if len(r.sweeps) < 2 {
		return 0, 0
	}
	var took time.Duration
	for _, s := range r.sweeps[1:] {
		took += s.took
		removed += s.removed
	}
	last := r.sweeps[len(r.sweeps)-1]
	span := last.at + last.took - r.sweeps[1].at
	return float64(took) / float64(max(span, 1)), removed
}

// flat is the smallest and largest size sampled in the last half of the
// cleanup phase.
func (r *result) flat(o options) (lo, hi int64) {
	from := o.duration/3 + (o.duration-o.duration/3)/2
	var sizes []int64
	for _, s := range r.samples {
		if s.cleanup && s.at >= from {
			sizes = append(sizes, s.bytes)
		}
	}
	if len(sizes) == 0 {
		return 0, 0
	}
	return slices.Min(sizes), slices.Max(sizes)
}

func summary(o options, rs []*result) {
	if len(rs) == 0 {
		return
	}
	fmt.Println("Side by side (same load, one run; ratios, since the machine is shared):")
	fmt.Printf("  %-44s", "")
	for _, r := range rs {
		fmt.Printf(" %14s", r.layout)
	}
	fmt.Println()
	row := func(name string, f func(*result) string) {
		fmt.Printf("  %-44s", name)
		for _, r := range rs {
			fmt.Printf(" %14s", f(r))
		}
		fmt.Println()
	}
	row("Do/s with cleanup / without", func(r *result) string { a, b := r.rates(); return fmt.Sprintf("%.2f", b/a) })
	row("size max/min, last half of cleanup", func(r *result) string {
		lo, hi := r.flat(o)
		return fmt.Sprintf("%.2f", float64(hi)/float64(max(lo, 1)))
	})
	row("size at the end (MiB)", func(r *result) string { return fmt.Sprintf("%.1f", float64(r.samples[len(r.samples)-1].bytes)/(1<<20)) })
	row("dead tuples at the end / live rows", func(r *result) string {
		s := r.samples[len(r.samples)-1]
		return fmt.Sprintf("%.2f", float64(s.dead)/float64(max(s.rows, 1)))
	})
	row("WAL per key with cleanup (B)", func(r *result) string { return fmt.Sprintf("%.0f", float64(r.walB)/float64(max(r.keysB, 1))) })
	row("WAL per key, with / without cleanup", func(r *result) string {
		return fmt.Sprintf("%.2f", (float64(r.walB)/float64(max(r.keysB, 1)))/(float64(r.walA)/float64(max(r.keysA, 1))))
	})
	row("backlog removal rate / insert rate", func(r *result) string {
		if len(r.sweeps) == 0 {
			return "-"
		}
		_, b := r.rates()
		return fmt.Sprintf("%.1f", perSec(r.sweeps[0].removed, r.sweeps[0].took)/b)
	})
	row("sweeper busy share after the backlog", func(r *result) string { b, _ := r.steady(); return fmt.Sprintf("%.1f%%", 100*b) })
	for i := 0; i+1 < len(rs); i += 2 {
		if strings.HasPrefix(rs[i].layout, "plain") && strings.HasPrefix(rs[i+1].layout, "partitioned") {
			a, a2 := rs[i].rates()
			b, b2 := rs[i+1].rates()
			fmt.Printf("  Do/s %s / %s: %.2f without cleanup, %.2f with cleanup\n", rs[i+1].layout, rs[i].layout, b/a, b2/a2)
		}
	}
}

func perSec(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
