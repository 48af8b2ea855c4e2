package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"
)

func goVersion() string { return runtime.Version() }
func gomaxprocs() int   { return runtime.GOMAXPROCS(0) }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func each(cs []cell, f func(cell) float64) []float64 {
	out := make([]float64, len(cs))
	for i, c := range cs {
		out[i] = f(c)
	}
	return out
}

// ratios pairs round r of a with round r of b: both ran side by side.
func ratios(a, b []cell, f func(cell) float64) []float64 {
	n := min(len(a), len(b))
	out := make([]float64, n)
	for i := 0; i < n; i++ {
		out[i] = f(a[i]) / f(b[i])
	}
	return out
}

// label names a level: its client count, and the emulated round trip.
func (l level) label() string {
	if l.rtt > 0 {
		return fmt.Sprintf("%d @%v", l.clients, l.rtt)
	}
	return fmt.Sprint(l.clients)
}

func ms(d float64) string { return fmt.Sprintf("%.2f", d/float64(time.Millisecond)) }

func spread(xs []float64) string {
	return fmt.Sprintf("%.2f (%.2f–%.2f)", median(xs), slices.Min(xs), slices.Max(xs))
}

func report(w io.Writer, levels []level, trips map[string]float64, cost map[string]costs) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "clients\tvariant\tops/s\tp50 ms\tp99 ms\tdead tuples/op\tHOT updates\t")
	for _, l := range levels {
		for _, v := range variants {
			cs := l.cells[v.name]
			if len(cs) == 0 {
				continue
			}
			dead, hot := "-", "-"
			if st, ok := l.stats[v.name]; ok && l.ops[v.name] > 0 {
				dead = fmt.Sprintf("%.2f", float64(st.dead)/float64(l.ops[v.name]))
				if st.upd > 0 {
					hot = fmt.Sprintf("%.0f%%", 100*float64(st.hotUpd)/float64(st.upd))
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t\n",
				l.label(), v.name,
				median(each(cs, cell.throughput)),
				ms(median(each(cs, func(c cell) float64 { return float64(c.p50) }))),
				ms(median(each(cs, func(c cell) float64 { return float64(c.p99) }))),
				dead, hot)
		}
	}
	tw.Flush()

	fmt.Fprintln(w)
	fmt.Fprintln(w, "Per operation, one client alone:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tround trips\tallocs\tbytes\tclient CPU µs\tserver CPU µs\t")
	for _, v := range variants {
		c := cost[v.name]
		server := "-"
		if c.serverCPU > 0 {
			server = fmt.Sprintf("%.0f", float64(c.serverCPU)/1e3)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.0f\t%.0f\t%.0f\t%s\t\n", v.name, trips[v.name], c.allocs, c.bytes, float64(c.clientCPU)/1e3, server)
	}
	tw.Flush()

	fmt.Fprintln(w)
	fmt.Fprintln(w, "Ratios: median over cycles of the ratio within a cycle (min–max); a cycle runs the variants back to back:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "clients\tDo/bare ops/s\tDo/peer ops/s\tDo/peertx ops/s\treplay p50 / Do p50\tDo p50 / bare p50\t")
	thr := cell.throughput
	p50 := func(c cell) float64 { return float64(c.p50) }
	for _, l := range levels {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", l.label(),
			spread(ratios(l.cells["do"], l.cells["bare"], thr)),
			spread(ratios(l.cells["do"], l.cells["peer"], thr)),
			spread(ratios(l.cells["do"], l.cells["peertx"], thr)),
			spread(ratios(l.cells["replay"], l.cells["do"], p50)),
			spread(ratios(l.cells["do"], l.cells["bare"], p50)))
	}
	tw.Flush()

	fmt.Fprintln(w)
	fmt.Fprintln(w, "Goals:")
	for _, l := range levels {
		doBare := median(ratios(l.cells["do"], l.cells["bare"], thr))
		doPeer := median(ratios(l.cells["do"], l.cells["peer"], thr))
		doPeertx := median(ratios(l.cells["do"], l.cells["peertx"], thr))
		rep := median(ratios(l.cells["replay"], l.cells["do"], p50))
		fmt.Fprintf(w, "  %7s clients: Do/bare %.2f (goal ≥ 0.80, stretch 0.90) %s; Do/peer %.2f (goal ≥ 1.30) %s; Do/peertx %.2f (goal ≥ 1.20) %s; replay p50/Do p50 %.2f (goal ≤ 0.35) %s\n",
			l.label(), doBare, verdict(doBare >= 0.8), doPeer, verdict(doPeer >= 1.3), doPeertx, verdict(doPeertx >= 1.2), rep, verdict(rep <= 0.35))
	}
	fmt.Fprintf(w, "  round trips: Do %.2f vs bare %.2f (goal: no more) %s; replay %.2f (goal: 1) %s\n",
		trips["do"], trips["bare"], verdict(trips["do"] <= trips["bare"]), trips["replay"], verdict(trips["replay"] <= 1))

	fmt.Fprintln(w)
	fmt.Fprintln(w, "Round trips: a counting TCP proxy on loopback, one connection, one client; a round trip is client")
	fmt.Fprintln(w, "bytes followed by server bytes (each time the client waits). Allocations: runtime.MemStats over a")
	fmt.Fprintln(w, "sequential loop, pgx included; CPU: getrusage for the client, /proc/<backend>/schedstat for the server.")
	fmt.Fprintln(w, "Dead tuples: growth of n_dead_tup over the level in the variant's own")
	fmt.Fprintln(w, "tables (autovacuum off, statistics flushed), per operation; HOT updates: n_tup_hot_upd / n_tup_upd.")
	fmt.Fprintln(w, "Latencies and ops/s: median over cycles of each slice's figure. \"8 @1ms\": 8 clients through a proxy")
	fmt.Fprintln(w, "that delays every chunk by half the round trip in each direction, as a network between the two would.")
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
