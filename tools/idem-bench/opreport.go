package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

func secs(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()) }

func pct(lat []time.Duration, q int) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	return lat[min(len(lat)-1, (len(lat)*q+99)/100-1)]
}

// bound is the most charges per second a flow could make at latency: Do
// keeps one connection per charge for the latency, the others one
// processor slot. 0 when there is no such bound.
func bound(r flowRun, o options) float64 {
	if r.latency <= 0 {
		return 0
	}
	n := o.opLimit
	if r.flow == "Do" {
		n = o.opPool
	}
	if n <= 0 {
		return 0
	}
	return float64(n) / r.latency.Seconds()
}

func throughputReport(w io.Writer, runs []flowRun, o options, limit string) {
	fmt.Fprintf(w, "Throughput: %d clients, each charge under a new key, their starts spread over latency × clients /\n"+
		"processor limit; charges completed in %v from half a latency after the last start (1 s at 0s). Bound: Do's\n"+
		"pool / latency (a charge holds a connection throughout), the others' processor limit (%s) / latency.\n",
		o.opClients, o.opWindow, limit)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "latency\tflow\tcharges/s\tbound/s\tof bound\tp50 s\tp99 s\tpeak at processor\trepeated keys\terrors\t")
	for _, r := range runs {
		b, of := "-", "-"
		if x := bound(r, o); x > 0 {
			b, of = fmt.Sprintf("%.1f", x), fmt.Sprintf("%.2f", r.win.rate()/x)
		}
		fmt.Fprintf(tw, "%v\t%s\t%.1f\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t\n", r.latency, r.flow, r.win.rate(), b, of,
			secs(pct(r.win.lat, 50)), secs(pct(r.win.lat, 99)), r.proc.peak, r.proc.repeats, r.win.errs)
	}
	tw.Flush()
	fmt.Fprintln(w, "p50, p99: of the charges completed in the span, waits for a connection or a processor slot included;\n"+
		"Do's queue for the pool still grows through the span. Peak at processor: most charges it served at once.")
	for _, r := range runs {
		if r.win.firstErr != nil {
			fmt.Fprintf(w, "  %v %s: %d errors, the first: %v\n", r.latency, r.flow, r.win.errs, r.win.firstErr)
		}
	}
	fmt.Fprintln(w, "Side by side (the three ran one after the other at each latency):")
	for _, lat := range o.opLatencies {
		rate := map[string]float64{}
		for _, r := range runs {
			if r.latency == lat {
				rate[r.flow] = r.win.rate()
			}
		}
		line := fmt.Sprintf("  %v: Operation/Do %.1f×, Operation/DBOS %.2f×", lat, rate["Operation"]/rate["Do"], rate["Operation"]/rate["DBOS"])
		if lat == 2*time.Second {
			line += fmt.Sprintf("; goals: Operation/Do ≥ 10× %s, Operation/DBOS ≥ 2× %s",
				verdict(rate["Operation"] >= 10*rate["Do"]), verdict(rate["Operation"] >= 2*rate["DBOS"]))
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
}

func costReport(w io.Writer, c *opCosts) {
	cycles := len(c.samples["Do"])
	fmt.Fprintf(w, "Per call: one client alone, the processor answering at once; medians over %d interleaved cycles\n"+
		"(a new key per call, except replays, which draw from the keys the variant above them finished).\n", cycles)
	med := func(ss []sample, f func(sample) time.Duration) float64 {
		xs := make([]float64, len(ss))
		for i, s := range ss {
			xs[i] = float64(f(s))
		}
		return median(xs)
	}
	mean := func(s sample) time.Duration { return s.mean }
	p50 := func(s sample) time.Duration { return s.p50 }
	p99 := func(s sample) time.Duration { return s.p99 }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "call\tmean ms\tp50 ms\tp99 ms\tround trips\t")
	row := func(name string, ss []sample, trips float64) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t\n", name, ms(med(ss, mean)), ms(med(ss, p50)), ms(med(ss, p99)), trips)
	}
	for _, name := range c.names {
		row(name, c.samples[name], c.trips[name])
		if name == "Operation" {
			row("  one database step of it", c.steps, c.stepTrips)
		}
	}
	tw.Flush()
	ratio := func(a, b []sample, f func(sample) time.Duration) string {
		n := min(len(a), len(b))
		xs := make([]float64, n)
		for i := range n {
			xs[i] = float64(f(a[i])) / float64(f(b[i]))
		}
		return spread(xs)
	}
	s := c.samples
	fmt.Fprintln(w, "Ratios of p50 (median over cycles of the ratio within a cycle, min–max):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range []struct {
		name string
		a, b []sample
	}{
		{"Operation replay / Do replay", s["Operation replay"], s["Do replay"]},
		{"database step / Do, 1 write", c.steps, s["Do, 1 write"]},
		{"Operation / Do", s["Operation"], s["Do"]},
		{"DBOS / Operation", s["DBOS"], s["Operation"]},
		{"DBOS, 1 step / Operation, 1 step", s["DBOS, 1 step"], s["Operation, 1 step"]},
		{"DBOS replay / Operation replay", s["DBOS replay"], s["Operation replay"]},
	} {
		fmt.Fprintf(tw, "  %s\t%s\n", r.name, ratio(r.a, r.b, p50))
	}
	tw.Flush()
	fmt.Fprintf(w, "Round trips: a counting proxy, one call at a time (idem: one connection; DBOS: a pool of 3, one\n"+
		"of them its listener's), after a warm-up; DBOS's counts less what it sent while idle (%.2f/s). A\n"+
		"database step's: from StepStart to StepEnd of an idem.StepObserver.\n\n", c.dbosIdle)
}

func contrastReport(w io.Writer, lines []contrastLine) {
	fmt.Fprintf(w, "Changed input and duplicates under one key (processor at %v; the calls marked \"while\" start\n"+
		"0.2 s after the first):\n", demoLatency)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tcall\tanswer\ttook s\t")
	for _, l := range lines {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t\n", l.who, l.call, l.answer, l.took.Seconds())
	}
	tw.Flush()
}
