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

func report(w io.Writer, levels []level, trips map[string]float64, cost map[string][]costs) {
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
	rounds := len(cost["do"])
	fmt.Fprintf(w, "Per operation, one client alone (CPU: median of %d rounds, min–max):\n", rounds)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tround trips\tallocs\tbytes\tclient CPU µs\tserver CPU µs\ttotal CPU µs\t")
	for _, v := range variants {
		cs := cost[v.name]
		if len(cs) == 0 {
			continue
		}
		server := "-"
		if cs[0].serverCPU > 0 {
			server = fmt.Sprintf("%.0f", median(eachCost(cs, func(c costs) float64 { return us(c.serverCPU) })))
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.0f\t%.0f\t%.0f\t%s\t%s\t\n", v.name, trips[v.name],
			median(eachCost(cs, func(c costs) float64 { return c.allocs })),
			median(eachCost(cs, func(c costs) float64 { return c.bytes })),
			median(eachCost(cs, func(c costs) float64 { return us(c.clientCPU) })),
			server, spreadInt(eachCost(cs, costs.total)))
	}
	tw.Flush()
	if closed := distanceClosed(cost); closed != nil {
		fmt.Fprintf(w, "Total CPU per first execution, do against eager (the protocol before) and atend (the key row\n"+
			"inserted once with COMMIT, no contract): share of the distance from eager to atend that do closes,\n"+
			"within each round: %s (goal ≥ 0.50) %s\n", spread(closed), verdict(median(closed) >= 0.5))
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "Ratios: median over cycles of the ratio within a cycle (min–max); a cycle runs the variants back to back:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "clients\tDo/bare ops/s\teager/bare ops/s\tatend/bare ops/s\tDo/peer ops/s\tDo/peertx ops/s\treplay p50 / Do p50\tDo p50 / bare p50\t")
	thr := cell.throughput
	p50 := func(c cell) float64 { return float64(c.p50) }
	for _, l := range levels {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", l.label(),
			spread(ratios(l.cells["do"], l.cells["bare"], thr)),
			spread(ratios(l.cells["eager"], l.cells["bare"], thr)),
			spread(ratios(l.cells["atend"], l.cells["bare"], thr)),
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
		doPeertx := median(ratios(l.cells["do"], l.cells["peertx"], thr))
		rep := median(ratios(l.cells["replay"], l.cells["do"], p50))
		line := fmt.Sprintf("  %7s clients: Do/bare %.2f", l.label(), doBare)
		switch {
		case l.rtt == 0 && l.clients == 1:
			line += fmt.Sprintf(" (goal ≥ 0.72) %s", verdict(doBare >= 0.72))
		case l.rtt == 0 && l.clients == 8:
			line += fmt.Sprintf(" (goal ≥ 0.62) %s", verdict(doBare >= 0.62))
		}
		line += fmt.Sprintf("; Do/peertx %.2f (goal ≥ 1.20) %s; replay p50/Do p50 %.2f", doPeertx, verdict(doPeertx >= 1.2), rep)
		fmt.Fprintln(w, line)
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

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func (c costs) total() float64 { return us(c.clientCPU + c.serverCPU) }

func eachCost(cs []costs, f func(costs) float64) []float64 {
	out := make([]float64, len(cs))
	for i, c := range cs {
		out[i] = f(c)
	}
	return out
}

func spreadInt(xs []float64) string {
	return fmt.Sprintf("%.0f (%.0f–%.0f)", median(xs), slices.Min(xs), slices.Max(xs))
}

// distanceClosed is, per round of the cost count, (eager − do) / (eager −
// atend) in total CPU per operation: 0 where do costs what the protocol
// before it cost, 1 where it costs what the contract-free reference costs.
// Nil when a round lacks a figure or eager is not dearer than atend.
func distanceClosed(cost map[string][]costs) []float64 {
	do, eager, atend := cost["do"], cost["eager"], cost["atend"]
	if len(do) == 0 || len(do) != len(eager) || len(do) != len(atend) {
		return nil
	}
	var out []float64
	for i := range do {
		e, d, a := eager[i].total(), do[i].total(), atend[i].total()
		if e <= a {
			continue
		}
		out = append(out, (e-d)/(e-a))
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
