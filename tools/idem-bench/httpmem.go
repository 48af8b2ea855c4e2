package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/idemhq/idem/idemhttp"
)

// memCase is one response shape of the memory measurement.
type memCase struct {
	size  int // response body bytes
	chunk int // bytes per Write; 0 for one Write
}

// memCases are the response sizes measured: 1 KiB, 64 KiB, 600 KiB (not a
// power of two, where a buffer grown by doubling shows its slack), 1 MiB
// (exactly idemhttp's default cap, which is still held and stored) and one
// byte over the cap; each written at once, as json.Encoder does, and in
// 32 KiB writes, as io.Copy does.
var memCases = func() []memCase {
	sizes := []int{1 << 10, 64 << 10, 600 << 10, idemhttp.DefaultMaxResponseBytes, idemhttp.DefaultMaxResponseBytes + 1}
	var out []memCase
	for _, chunk := range []int{0, 32 << 10} {
		for _, size := range sizes {
			out = append(out, memCase{size, chunk})
		}
	}
	return out
}()

// memRounds is how many times each case is measured, alternating routes.
const memRounds = 3

// memFigure is what one route held per request for one case, over rounds.
type memFigure struct {
	route    string
	c        memCase
	status   int       // the answer the clients received
	live     []float64 // heap bytes live after GC, in flight minus idle, per request
	inuse    []float64 // heap spans in use, likewise
	stack    []float64 // goroutine stacks, likewise
	alloc    []float64 // bytes allocated per request, from idle to after release
	retained []float64 // live heap after release minus idle, per request
}

// holdGate parks handlers after they have written their response: each
// announces itself on arrived, then waits for release to close.
type holdGate struct {
	arrived chan struct{}
	release chan struct{}
}

// httpMemory measures, for each case and route, the memory a request holds
// while its handler is parked after writing its response: with idemhttp the
// response is held until the transaction ends, so that is where its memory
// shows. The server, handlers and clients share this process, so the
// figures include the client's side of each request, the same for both
// routes; the difference between the routes is the middleware's.
func (b *bench) httpMemory(ctx context.Context) ([]memFigure, error) {
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	largest := 0
	for _, c := range memCases {
		largest = max(largest, c.size)
	}
	// One body for every response, made before the idle reading, so that
	// the handlers' source is not counted: only what the request holds.
	pad := make([]byte, largest)
	for i := range pad {
		pad[i] = 'a' + byte(i%26)
	}
	var out []memFigure
	for _, c := range memCases {
		figs := []*memFigure{{route: routeBare, c: c}, {route: routeIdem, c: c}}
		for r := 0; r < memRounds; r++ {
			for i := range figs {
				f := figs[(i+r)%len(figs)]
				if err := b.holdOnce(ctx, f, pad); err != nil {
					return nil, fmt.Errorf("%s, %d bytes: %w", f.route, c.size, err)
				}
			}
		}
		for _, f := range figs {
			out = append(out, *f)
		}
	}
	return out, nil
}

// holdOnce measures one case on one route once, on a fresh pool and server
// so that no earlier case's buffers remain: it warms every connection with
// a held round of small responses, reads the idle heap, holds N requests of
// the case's size in flight and reads it again, then releases them.
func (b *bench) holdOnce(ctx context.Context, f *memFigure, pad []byte) error {
	n := b.opts.inflight
	pool, err := b.pool(ctx, n, "")
	if err != nil {
		return err
	}
	defer pool.Close()
	var gate atomic.Pointer[holdGate]
	hold := func() {
		g := gate.Load()
		g.arrived <- struct{}{}
		<-g.release
	}
	rig, err := startRig(ctx, pool, respond{pad: pad, hold: hold}, n)
	if err != nil {
		return err
	}
	defer rig.close()

	round := func(c memCase, measure func()) ([]int, error) {
		g := &holdGate{arrived: make(chan struct{}, n), release: make(chan struct{})}
		gate.Store(g)
		query := fmt.Sprintf("%s=%d&%s=%d", sizeParam, c.size, chunkParam, c.chunk)
		statuses := make([]int, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := rig.post(ctx, f.route, query, int64(1+i))
				statuses[i] = statusOf(err)
				if err == nil {
					statuses[i] = 200
				} else if statuses[i] == 0 {
					errs[i] = err
				}
			}()
		}
		timeout := time.After(30 * time.Second)
		for i := 0; i < n; i++ {
			select {
			case <-g.arrived:
			case <-timeout:
				close(g.release)
				wg.Wait()
				return nil, fmt.Errorf("only %d of %d requests reached the handler", i, n)
			}
		}
		// Let the bare route's bodies reach the clients' sockets.
		time.Sleep(200 * time.Millisecond)
		measure()
		close(g.release)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return nil, err
			}
		}
		return statuses, nil
	}

	// Every HTTP and database connection open, every statement prepared.
	if _, err := round(memCase{size: 1 << 10}, func() {}); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	idle := heapNow()
	var loaded memStat
	statuses, err := round(f.c, func() { loaded = heapNow() })
	if err != nil {
		return err
	}
	after := heapNow()
	f.status = statuses[0]
	for _, s := range statuses {
		if s != f.status {
			return fmt.Errorf("mixed answers: %d and %d", f.status, s)
		}
	}
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) }
	f.live = append(f.live, per(loaded.live, idle.live))
	f.inuse = append(f.inuse, per(loaded.inuse, idle.inuse))
	f.stack = append(f.stack, per(loaded.stack, idle.stack))
	f.alloc = append(f.alloc, per(after.total, idle.total))
	f.retained = append(f.retained, per(after.live, idle.live))
	return nil
}

// memStat is the heap after a full collection.
type memStat struct {
	live, inuse, stack, total uint64
}

// heapNow collects garbage and reads the heap: what is still referenced.
func heapNow() memStat {
	runtime.GC()
	runtime.GC() // the second sweeps what the first freed, for HeapInuse
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memStat{live: m.HeapAlloc, inuse: m.HeapInuse, stack: m.StackInuse, total: m.TotalAlloc}
}

// memReport prints, per case and route, the memory a request held in
// flight, what it allocated and what outlived it, per request.
func memReport(w io.Writer, figs []memFigure, n int) {
	fmt.Fprintf(w, "HTTP memory: %d requests held in flight inside the handler after it wrote its response;\n", n)
	fmt.Fprintf(w, "per request, in flight minus idle, after GC; median of %d rounds (min–max). Cap: idemhttp\n", memRounds)
	fmt.Fprintf(w, "Config.MaxResponseBytes, default %d bytes; one byte more is answered 500.\n", idemhttp.DefaultMaxResponseBytes)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "response B\twrites\troute\tstatus\tlive heap B/req\t× response\theap in use B/req\tstack B/req\tallocated B/req\tretained B/req\t")
	kib := func(xs []float64) string {
		return fmt.Sprintf("%.0f (%.0f–%.0f)", median(xs), slices.Min(xs), slices.Max(xs))
	}
	for _, f := range figs {
		writes := "one"
		if f.c.chunk > 0 {
			writes = fmt.Sprintf("%d KiB", f.c.chunk>>10)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\t\n",
			f.c.size, writes, f.route, f.status, kib(f.live), median(f.live)/float64(f.c.size),
			median(f.inuse), median(f.stack), median(f.alloc), median(f.retained))
	}
	tw.Flush()
	fmt.Fprintln(w, "live heap: runtime.MemStats.HeapAlloc; heap in use: HeapInuse (spans, so fragmentation too);")
	fmt.Fprintln(w, "allocated: TotalAlloc from idle to after release (every copy the request made); retained: live heap")
	fmt.Fprintln(w, "after release minus idle (what the pools kept). Server, handlers and clients share this process.")
}
