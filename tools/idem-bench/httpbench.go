package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// httpClients are the client counts of the HTTP throughput comparison.
var httpClients = []int{1, 8}

// httpMode compares idemhttp with a bare handler over HTTP, the database
// behind the emulated network (-rtt), then measures the memory a request
// holds while it is in flight.
func (b *bench) httpMode(ctx context.Context, w io.Writer) error {
	if b.opts.inflight < 1 {
		return fmt.Errorf("-http-inflight %d: must be at least 1", b.opts.inflight)
	}
	var via *tripProxy
	if b.opts.rtt > 0 {
		p, err := startProxy(ctx, net.JoinHostPort(b.server.Host, fmt.Sprint(b.server.Port)), b.opts.rtt/2)
		if err != nil {
			return err
		}
		defer p.close()
		via = p
	}
	var levels []level
	for _, n := range httpClients {
		l, err := b.httpTimed(ctx, n, b.opts.cycles, via)
		if err != nil {
			return fmt.Errorf("HTTP, %d clients: %w", n, err)
		}
		levels = append(levels, l)
	}
	httpReport(w, levels)
	fmt.Fprintln(w)
	mem, err := b.httpMemory(ctx)
	if err != nil {
		return fmt.Errorf("HTTP memory: %w", err)
	}
	memReport(w, mem, b.opts.inflight)
	return nil
}

// httpVariants are the two routes, as variants that runClients can drive:
// each op is one POST under a new key, on the rig the level set up.
func httpVariants(rig *httpRig) []variant {
	route := func(name, path string) variant {
		return variant{name, func(ctx context.Context, _ *pgxpool.Pool, c *client) error {
			return rig.post(ctx, path, "", c.account())
		}}
	}
	return []variant{route("bare", routeBare), route("idemhttp", routeIdem)}
}

// httpTimed runs the interleaved cycles of the two routes at n clients, on
// tables reset for this client count and a pool of n connections reached
// through via (nil: directly).
func (b *bench) httpTimed(ctx context.Context, n, cycles int, via *tripProxy) (level, error) {
	l, pool, err := b.startLevel(ctx, n, via)
	if err != nil {
		return l, err
	}
	defer pool.Close()
	rig, err := startRig(ctx, pool, respond{}, n)
	if err != nil {
		return l, err
	}
	defer rig.close()
	clients := make([]*client, n)
	for i := range clients {
		clients[i] = newClient(i, fmt.Sprintf("h%d", n))
	}
	vs := httpVariants(rig)
	slice := func(v variant, d time.Duration) (cell, error) {
		out := runClients(ctx, nil, clients, v, d)
		if out.errs > 0 {
			return out, fmt.Errorf("%s: %d errors, first: %w", v.name, out.errs, out.firstErr)
		}
		return out, nil
	}
	// The warm-up opens every HTTP connection and prepares every statement.
	for _, v := range vs {
		if _, err := slice(v, 500*time.Millisecond); err != nil {
			return l, err
		}
	}
	for r := 0; r < cycles; r++ {
		for i := range vs {
			v := vs[(i+r)%len(vs)]
			c, err := slice(v, b.opts.slice)
			if err != nil {
				return l, err
			}
			l.cells[v.name] = append(l.cells[v.name], c)
			l.ops[v.name] += c.ops
		}
	}
	return l, nil
}

// httpGoal is the least idemhttp/bare throughput the HTTP layer aims for.
const httpGoal = 0.9

// httpReport prints each route's throughput and latency per level, then
// the per-cycle ratios of idemhttp to bare and the goal.
func httpReport(w io.Writer, levels []level) {
	fmt.Fprintln(w, "HTTP: POST with a new Idempotency-Key, idemhttp vs the same handler in a bare transaction:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "clients\tvariant\tops/s\tp50 ms\tp99 ms\t")
	for _, l := range levels {
		for _, name := range []string{"bare", "idemhttp"} {
			cs := l.cells[name]
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t\n", l.label(), name,
				median(each(cs, cell.throughput)),
				ms(median(each(cs, func(c cell) float64 { return float64(c.p50) }))),
				ms(median(each(cs, func(c cell) float64 { return float64(c.p99) }))))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "clients\tcycles\tidemhttp/bare ops/s\tidemhttp p50 / bare p50\t")
	thr := cell.throughput
	p50 := func(c cell) float64 { return float64(c.p50) }
	for _, l := range levels {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\n", l.label(), len(l.cells["bare"]),
			spread(ratios(l.cells["idemhttp"], l.cells["bare"], thr)),
			spread(ratios(l.cells["idemhttp"], l.cells["bare"], p50)))
	}
	tw.Flush()
	for _, l := range levels {
		r := median(ratios(l.cells["idemhttp"], l.cells["bare"], thr))
		fmt.Fprintf(w, "  goal %7s clients: idemhttp/bare %.2f (goal ≥ %.2f) %s\n", l.label(), r, httpGoal, verdict(r >= httpGoal))
	}
	fmt.Fprintln(w, "Ratios: median over cycles of the ratio within a cycle (min–max); the server, both handlers and")
	fmt.Fprintln(w, "the clients run in this process, the database behind the emulated network.")
}
