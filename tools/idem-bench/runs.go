package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

var variants = []variant{bare, do, replay, eager, atend, peer, peertx}

// sequence runs each variant n times on one client, in the order of
// variants rotated by rotate (so that over rounds each variant meets the
// machine's other load as often as the next), after a warm-up that prepares
// every statement; replays draw from keys do made. measure brackets the
// counted operations of each variant.
func (b *bench) sequence(ctx context.Context, pool *pgxpool.Pool, n, rotate int, measure func(name string, ops int, body func() error) error) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	c := newClient(0, "seq")
	for i := 0; i < 20; i++ { // keys for replay, whatever the order
		if err := do.op(ctx, pool, c); err != nil {
			return fmt.Errorf("do warm-up: %w", err)
		}
	}
	for i := range variants {
		v := variants[(i+rotate)%len(variants)]
		if v.name == "replay" {
			c.replay = c.made
		}
		for i := 0; i < 20; i++ {
			if err := v.op(ctx, pool, c); err != nil {
				return fmt.Errorf("%s warm-up: %w", v.name, err)
			}
		}
		c.pregenerate(n)
		err := measure(v.name, n, func() error {
			for i := 0; i < n; i++ {
				if err := v.op(ctx, pool, c); err != nil {
					return fmt.Errorf("%s: %w", v.name, err)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// countTrips runs the sequence through the counting proxy.
func (b *bench) countTrips(ctx context.Context) (map[string]float64, error) {
	target := net.JoinHostPort(b.server.Host, fmt.Sprint(b.server.Port))
	p, err := startProxy(ctx, target, 0)
	if err != nil {
		return nil, err
	}
	defer p.close()
	pool, err := b.pool(ctx, 1, p.addr().String())
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	out := map[string]float64{}
	err = b.sequence(ctx, pool, b.opts.tripOps, 0, func(name string, ops int, body func() error) error {
		before := p.trips.Load()
		if err := body(); err != nil {
			return err
		}
		out[name] = float64(p.trips.Load()-before) / float64(ops)
		return nil
	})
	return out, err
}

// costs are what one operation costs the client and the server, measured
// on one client running alone.
type costs struct {
	allocs, bytes float64 // heap allocations and bytes in the client
	clientCPU     time.Duration
	serverCPU     time.Duration // 0 when the server's backend is not local
}

// countCosts runs the sequence on one client and reads, around each
// variant, the allocator's counters (every allocation of the process during
// the loop, pgx's included), the process's CPU time, and the CPU time of the
// server backend serving the connection (from /proc, when the server runs on
// this machine). CPU time barely depends on the machine's other load, which
// makes it the steadiest comparison of what each variant asks of each side.
func (b *bench) countCosts(ctx context.Context) (map[string][]costs, error) {
	out := map[string][]costs{}
	for r := 0; r < b.opts.costRounds; r++ {
		if err := b.countCostsOnce(ctx, out, r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// countCostsOnce is one round of countCosts, on a fresh pool and tables:
// each variant's figures are appended to out.
func (b *bench) countCostsOnce(ctx context.Context, out map[string][]costs, rotate int) error {
	pool, err := b.pool(ctx, 1, "")
	if err != nil {
		return err
	}
	defer pool.Close()
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return err
	}
	return b.sequence(ctx, pool, b.opts.allocOps, rotate, func(name string, ops int, body func() error) error {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		c0, s0 := processCPU(), backendCPU(backend)
		if err := body(); err != nil {
			return err
		}
		c1, s1 := processCPU(), backendCPU(backend)
		runtime.ReadMemStats(&m1)
		c := costs{
			allocs:    float64(m1.Mallocs-m0.Mallocs) / float64(ops),
			bytes:     float64(m1.TotalAlloc-m0.TotalAlloc) / float64(ops),
			clientCPU: (c1 - c0) / time.Duration(ops),
		}
		if s0 > 0 && s1 > 0 {
			c.serverCPU = (s1 - s0) / time.Duration(ops)
		}
		out[name] = append(out[name], c)
		return nil
	})
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU reads the nanoseconds a local process has run, from the first
// field of /proc/<pid>/schedstat; 0 when it cannot be read.
func backendCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return 0
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0
	}
	return time.Duration(ns)
}

// cell is one variant's slice of one cycle at one client count.
type cell struct {
	ops      int
	errs     int
	firstErr error
	elapsed  time.Duration
	p50, p99 time.Duration
}

func (c cell) throughput() float64 { return float64(c.ops) / c.elapsed.Seconds() }

// level is every cycle at one client count: cells[variant][cycle], and the
// table statistics each writing variant left behind over the whole level.
type level struct {
	clients int
	rtt     time.Duration // emulated network round trip; 0 on loopback
	cells   map[string][]cell
	stats   map[string]tableStats
	ops     map[string]int
}

// schemaOf names the table set a variant writes to.
var schemaOf = map[string]string{"bare": "bare.", "do": "", "peer": "peer.", "peertx": "peertx.", "eager": "eager.", "atend": "atend."}

// startLevel begins a level at n clients: the tables reset, a pool of n
// connections reached through via (nil: directly).
func (b *bench) startLevel(ctx context.Context, n int, via *tripProxy) (level, *pgxpool.Pool, error) {
	l := level{clients: n, cells: map[string][]cell{}, ops: map[string]int{}}
	if err := b.reset(ctx); err != nil {
		return l, nil, err
	}
	addr := ""
	if via != nil {
		addr, l.rtt = via.addr().String(), 2*via.delay
	}
	pool, err := b.pool(ctx, n, addr)
	return l, pool, err
}

// timed runs the interleaved cycles at n clients, on tables reset for this
// client count. Each cycle runs every variant for one slice, in an order
// that rotates from cycle to cycle, so that each variant meets the machine's
// other load as often as the next. Replays draw from every key that do has
// completed so far.
func (b *bench) timed(ctx context.Context, n, cycles int, via *tripProxy) (level, error) {
	l, pool, err := b.startLevel(ctx, n, via)
	if err != nil {
		return l, err
	}
	defer pool.Close()
	clients := make([]*client, n)
	for i := range clients {
		clients[i] = newClient(i, fmt.Sprintf("c%d", n))
	}
	var done []string
	slice := func(v variant, d time.Duration) (cell, error) {
		for _, c := range clients {
			c.replay = done
		}
		out := runClients(ctx, pool, clients, v, d)
		if out.errs > 0 {
			return out, fmt.Errorf("%s: %d errors, first: %w", v.name, out.errs, out.firstErr)
		}
		for _, c := range clients {
			done = append(done, c.made...)
			c.made = c.made[:0]
		}
		return out, nil
	}
	// The warm-up prepares every statement on every connection.
	for _, v := range variants {
		if _, err := slice(v, 300*time.Millisecond); err != nil {
			return l, err
		}
	}
	before, err := readStats(ctx, b.admin, pool)
	if err != nil {
		return l, err
	}
	for r := 0; r < cycles; r++ {
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			c, err := slice(v, b.opts.slice)
			if err != nil {
				return l, err
			}
			l.cells[v.name] = append(l.cells[v.name], c)
			l.ops[v.name] += c.ops
		}
	}
	after, err := readStats(ctx, b.admin, pool)
	if err != nil {
		return l, err
	}
	l.stats = map[string]tableStats{}
	for name, schema := range schemaOf {
		l.stats[name] = after[schema].sub(before[schema])
	}
	return l, nil
}

func runClients(ctx context.Context, pool *pgxpool.Pool, clients []*client, v variant, d time.Duration) cell {
	lat := make([][]time.Duration, len(clients))
	errs := make([]int, len(clients))
	firstErr := make([]error, len(clients))
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]time.Duration, 0, 4096)
			for {
				t0 := time.Now()
				if t0.After(deadline) {
					break
				}
				if err := v.op(ctx, pool, c); err != nil {
					if errs[i] == 0 {
						firstErr[i] = err
					}
					errs[i]++
					continue
				}
				buf = append(buf, time.Since(t0))
			}
			lat[i] = buf
		}()
	}
	wg.Wait()
	out := cell{elapsed: time.Since(start)}
	var all []time.Duration
	for i := range clients {
		all = append(all, lat[i]...)
		out.errs += errs[i]
		if out.firstErr == nil {
			out.firstErr = firstErr[i]
		}
	}
	out.ops = len(all)
	slices.Sort(all)
	if len(all) > 0 {
		out.p50 = all[len(all)/2]
		out.p99 = all[min(len(all)-1, (len(all)*99+99)/100-1)]
	}
	return out
}
