package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// The -operations mode: a charge that calls a slow card processor, done in
// one idem.Do transaction (the processor call inside fn), as an
// idem.Operation (reserve step, charge external step, receipt step) and as
// the same workflow in DBOS Transact, side by side in one run:
//
//   - throughput: charges per second with many clients, each charge under
//     a new key, on pools of the same size, at each processor latency;
//   - per call, one client alone, the processor answering at once: the
//     latency and round trips of each charge, of one database step against
//     one Do, and of the replay of a finished charge;
//   - how each answers a changed input and a duplicate under one key.
//
// DBOS's system database, idem_bench_<pid>_dbos, is created and dropped
// with the benchmark's own.

// window is what the clients completed within one measured span.
type window struct {
	ops      int
	errs     int
	firstErr error
	span     time.Duration
	lat      []time.Duration // sorted
}

func (w window) rate() float64 { return float64(w.ops) / w.span.Seconds() }

// saturate runs n clients that charge in a loop, each charge under a new
// key, for warm and then span. It counts the charges that completed within
// span; when span ends it cancels the charges still running, whose
// answers do not count. The clients start spread over stagger (at most
// warm), so that charges of one latency do not complete in waves.
func saturate(ctx context.Context, n int, stagger, warm, span time.Duration, prefix string, charge func(ctx context.Context, key string) error) window {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	from, to := start.Add(warm), start.Add(warm+span)
	stop := time.AfterFunc(warm+span, cancel)
	defer stop.Stop()
	lat := make([][]time.Duration, n)
	errs := make([]int, n)
	firstErr := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := prefix + "-" + strconv.Itoa(i) + "-"
			if stagger > 0 {
				t := time.NewTimer(stagger * time.Duration(i) / time.Duration(n))
				select {
				case <-t.C:
				case <-runCtx.Done():
					t.Stop()
					return
				}
			}
			for seq := 1; runCtx.Err() == nil; seq++ {
				t0 := time.Now()
				err := charge(runCtx, base+strconv.Itoa(seq))
				t1 := time.Now()
				if t1.After(to) || runCtx.Err() != nil {
					return
				}
				if err != nil {
					if t1.After(from) {
						if errs[i] == 0 {
							firstErr[i] = err
						}
						errs[i]++
					}
					time.Sleep(10 * time.Millisecond) // no busy loop on a failing database
					continue
				}
				if !t1.Before(from) {
					lat[i] = append(lat[i], t1.Sub(t0))
				}
			}
		}()
	}
	wg.Wait()
	w := window{span: span}
	for i := range n {
		w.lat = append(w.lat, lat[i]...)
		w.errs += errs[i]
		if w.firstErr == nil {
			w.firstErr = firstErr[i]
		}
	}
	slices.Sort(w.lat)
	w.ops = len(w.lat)
	return w
}

// flowRun is one way of charging measured at one latency.
type flowRun struct {
	latency time.Duration
	flow    string
	win     window
	proc    procStats
}

// sample is one variant's latencies over one slice of the per-call
// measurement.
type sample struct {
	ops            int
	mean, p50, p99 time.Duration
}

func sampleOf(d []time.Duration) sample {
	if len(d) == 0 {
		return sample{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	var sum time.Duration
	for _, x := range s {
		sum += x
	}
	return sample{ops: len(s), mean: sum / time.Duration(len(s)), p50: s[len(s)/2],
		p99: s[min(len(s)-1, (len(s)*99+99)/100-1)]}
}

// timeSlice runs op on one client for d and times each call.
func timeSlice(d time.Duration, op func() error) ([]time.Duration, error) {
	var out []time.Duration
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		t0 := time.Now()
		if err := op(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0))
	}
	return out, nil
}

// stepWatch is a StepObserver that keeps the duration of each database
// step that ran, and, given a counting proxy, its round trips.
type stepWatch struct {
	proxy *tripProxy
	mu    sync.Mutex
	at    int64
	dur   []time.Duration
	trips []int64
}

func (o *stepWatch) CallStart(ctx context.Context, _ idem.CallStart) context.Context { return ctx }
func (o *stepWatch) CallEnd(context.Context, idem.CallEnd)                           {}

func (o *stepWatch) StepStart(ctx context.Context, s idem.StepStart) context.Context {
	if s.Kind == idem.StepDatabase && o.proxy != nil {
		o.mu.Lock()
		o.at = o.proxy.trips.Load()
		o.mu.Unlock()
	}
	return ctx
}

func (o *stepWatch) StepEnd(_ context.Context, s idem.StepEnd) {
	if s.Kind != idem.StepDatabase || s.Recorded || s.Err != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dur = append(o.dur, s.Duration)
	if o.proxy != nil {
		o.trips = append(o.trips, o.proxy.trips.Load()-o.at)
	}
}

// take returns the durations kept since the last take.
func (o *stepWatch) take() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := o.dur
	o.dur = nil
	return d
}

// keyPool is the keys a variant made, for its replays to draw from.
type keyPool struct {
	seq  int
	pre  string
	made []string
	rng  *rand.Rand
}

func newKeyPool(prefix string) *keyPool {
	return &keyPool{pre: prefix + "-", rng: rand.New(rand.NewPCG(uint64(len(prefix)), 0x1dea))}
}

func (k *keyPool) next() string {
	k.seq++
	return k.pre + strconv.Itoa(k.seq)
}

func (k *keyPool) any() string { return k.made[k.rng.IntN(len(k.made))] }

// callVariant is one kind of call in the per-call measurement.
type callVariant struct {
	name string
	run  func(ctx context.Context) error
}

// callVariants are the calls of the per-call measurement, on db (the idem
// side) and d (DBOS); the Operation reports its steps to watch.
func callVariants(db *idem.Client, d *dbosBench, proc *processor, tag string) ([]callVariant, error) {
	op, err := newChargeOp(db, proc)
	if err != nil {
		return nil, err
	}
	reserveOp, err := newReserveOp(db)
	if err != nil {
		return nil, err
	}
	doKeys, do1Keys, opKeys, op1Keys, dbosKeys, dbos1Keys := newKeyPool(tag+"do"), newKeyPool(tag+"do1"),
		newKeyPool(tag+"op"), newKeyPool(tag+"op1"), newKeyPool(tag+"dbos"), newKeyPool(tag+"dbos1")
	made := func(k *keyPool, run func(key string) error) func(ctx context.Context) error {
		return func(context.Context) error {
			key := k.next()
			if err := run(key); err != nil {
				return err
			}
			k.made = append(k.made, key)
			return nil
		}
	}
	return []callVariant{
		{"Do", made(doKeys, func(key string) error {
			return checkCharge(heldCharge(context.Background(), db, proc, key))
		})},
		{"Do, 1 write", made(do1Keys, func(key string) error {
			_, err := heldReserve(context.Background(), db, key)
			return err
		})},
		{"Do replay", func(ctx context.Context) error {
			_, err := idem.Do(ctx, db, doKeys.any(), reqHash, func(pgx.Tx) (chargeResp, error) {
				return chargeResp{}, errReplayRan
			})
			return err
		}},
		{"Operation", made(opKeys, func(key string) error { return runOp(context.Background(), op, key, false) })},
		{"Operation, 1 step", made(op1Keys, func(key string) error {
			return runOp(context.Background(), reserveOp, key, false)
		})},
		{"Operation replay", func(ctx context.Context) error { return runOp(ctx, op, opKeys.any(), true) }},
		{"DBOS", made(dbosKeys, func(key string) error {
			return checkCharge(d.runCharge(context.Background(), key, chargeReq{Amount: chargeAmount}))
		})},
		{"DBOS, 1 step", made(dbos1Keys, func(key string) error { return d.runReserve(context.Background(), key) })},
		{"DBOS replay", func(ctx context.Context) error {
			return checkCharge(d.runCharge(ctx, dbosKeys.any(), chargeReq{Amount: chargeAmount}))
		}},
	}, nil
}

// opCosts is the per-call measurement: samples[variant][cycle], the
// database steps' durations per cycle, and round trips per call.
type opCosts struct {
	names   []string
	samples map[string][]sample
	steps   []sample
	trips   map[string]float64
	// stepTrips is the round trips of one database step; dbosIdle is the
	// background round trips per second DBOS made while idle, subtracted
	// from its counts.
	stepTrips float64
	dbosIdle  float64
}

func (b *bench) operationsMode(ctx context.Context, w io.Writer) error {
	o := b.opts
	if o.opClients < 1 || o.opPool < 1 || o.opWindow <= 0 || o.opCycles < 1 || o.opSlice <= 0 || o.opTripOps < 1 {
		return errors.New("-op-clients, -op-pool, -op-window, -op-cycles, -op-slice and -op-trip-ops must be positive")
	}
	if _, err := b.admin.Exec(ctx, opTablesSQL); err != nil {
		return fmt.Errorf("set up the charge's tables: %w", err)
	}
	dbosDB := b.dbName + "_dbos"
	drop, err := b.createDatabase(ctx, dbosDB, dbosTablesSQL)
	if err != nil {
		return err
	}
	defer drop()

	proc := newProcessor(o.opLimit)
	pool, err := b.poolOn(ctx, b.dbName, o.opPool, "")
	if err != nil {
		return err
	}
	defer pool.Close()
	plain, err := idem.NewClient(pool, nil)
	if err != nil {
		return err
	}
	op, err := newChargeOp(plain, proc)
	if err != nil {
		return err
	}
	// DBOS's notification listener holds one connection of its pool for
	// good: one more leaves it as many for its work as the others have.
	dpool, err := b.poolOn(ctx, dbosDB, o.opPool+1, "")
	if err != nil {
		return err
	}
	d, err := startDBOS(ctx, dpool, proc, "bench")
	if err != nil {
		dpool.Close()
		return err
	}
	defer d.shutdown()

	fmt.Fprintf(w, "Operations made of steps: a charge (reserve: a database write; charge: the fake processor; receipt: a\n"+
		"database write) in one Do transaction, as an idem.Operation, and as a DBOS Transact %s workflow.\n"+
		"Pools: %d connections for Do and the Operation (one pool), %d for DBOS (%d and the one its notification\n"+
		"listener keeps). Processor: in process, honours idempotency keys, at most %s charges at once.\n\n",
		dbosVersion(), o.opPool, o.opPool+1, o.opPool, proc.limitText())

	// Throughput.
	flows := []struct {
		name   string
		charge func(ctx context.Context, key string) error
	}{
		{"Do", func(ctx context.Context, key string) error { return checkCharge(heldCharge(ctx, pool, proc, key)) }},
		{"Operation", func(ctx context.Context, key string) error { return runOp(ctx, op, key, false) }},
		{"DBOS", func(ctx context.Context, key string) error {
			return checkCharge(d.runCharge(ctx, key, chargeReq{Amount: chargeAmount}))
		}},
	}
	var runs []flowRun
	for li, lat := range o.opLatencies {
		for i := range flows {
			f := flows[(i+li)%len(flows)]
			proc.reset(lat)
			stagger, warm := startSpread(lat, o)
			win := saturate(ctx, o.opClients, stagger, warm, o.opWindow, fmt.Sprintf("t%d-%s", li, f.name), f.charge)
			if err := ctx.Err(); err != nil {
				return err
			}
			runs = append(runs, flowRun{latency: lat, flow: f.name, win: win, proc: proc.stats()})
		}
	}
	throughputReport(w, runs, o, proc.limitText())

	// Per call, on a Client that times the steps.
	watch := &stepWatch{}
	keys, err := idem.NewClient(pool, &idem.Config{Observer: watch})
	if err != nil {
		return err
	}
	proc.reset(0)
	costs, err := b.opCallCosts(ctx, keys, d, proc, watch)
	if err != nil {
		return fmt.Errorf("per call: %w", err)
	}
	if err := b.opTrips(ctx, dbosDB, proc, costs); err != nil {
		return fmt.Errorf("round trips: %w", err)
	}
	costReport(w, costs)

	// Changed input, duplicates.
	proc.reset(demoLatency)
	lines, err := contrast(ctx, op, d)
	if err != nil {
		return fmt.Errorf("changed input and duplicates: %w", err)
	}
	contrastReport(w, lines)
	return nil
}

// startSpread is how long the clients' starts are spread over at latency lat,
// and the warm-up before the measured span. The starts spread over lat ×
// clients / processor limit, so that the charges first served, one per
// processor slot, start over one latency, and the processor's slots then
// free up evenly. Do's ten connections still complete their charges in
// near waves, one a latency; the warm-up ends half a latency after the
// starts, so that, with a span a multiple of the latency, no wave falls on
// an edge of it.
func startSpread(lat time.Duration, o options) (stagger, warm time.Duration) {
	if lat <= 0 {
		return 0, time.Second
	}
	stagger = lat
	if o.opLimit > 0 && o.opClients > o.opLimit {
		stagger = lat * time.Duration(o.opClients) / time.Duration(o.opLimit)
	}
	return stagger, stagger + lat/2
}

// opCallCosts times each call variant on one client, in interleaved
// cycles, the processor answering at once.
func (b *bench) opCallCosts(ctx context.Context, keys *idem.Client, d *dbosBench, proc *processor, watch *stepWatch) (*opCosts, error) {
	vs, err := callVariants(keys, d, proc, "c")
	if err != nil {
		return nil, err
	}
	c := &opCosts{samples: map[string][]sample{}, trips: map[string]float64{}}
	for _, v := range vs {
		c.names = append(c.names, v.name)
	}
	// The warm-up prepares the statements and makes keys for the replays.
	for _, v := range vs {
		if _, err := timeSlice(300*time.Millisecond, func() error { return v.run(ctx) }); err != nil {
			return nil, fmt.Errorf("%s warm-up: %w", v.name, err)
		}
	}
	watch.take()
	for r := 0; r < b.opts.opCycles; r++ {
		for i := range vs {
			v := vs[(i+r)%len(vs)]
			lat, err := timeSlice(b.opts.opSlice, func() error { return v.run(ctx) })
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			c.samples[v.name] = append(c.samples[v.name], sampleOf(lat))
			if v.name == "Operation" {
				c.steps = append(c.steps, sampleOf(watch.take()))
			} else {
				watch.take()
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// opTrips counts the round trips of each call variant through a counting
// proxy, one call at a time on one connection (DBOS: one for its work and
// its notification listener's), after a warm-up.
func (b *bench) opTrips(ctx context.Context, dbosDB string, proc *processor, c *opCosts) error {
	target := net.JoinHostPort(b.server.Host, fmt.Sprint(b.server.Port))
	p, err := startProxy(ctx, target, 0)
	if err != nil {
		return err
	}
	defer p.close()
	pool, err := b.poolOn(ctx, b.dbName, 1, p.addr().String())
	if err != nil {
		return err
	}
	defer pool.Close()
	watch := &stepWatch{proxy: p}
	keys, err := idem.NewClient(pool, &idem.Config{Observer: watch})
	if err != nil {
		return err
	}
	dp, err := startProxy(ctx, target, 0)
	if err != nil {
		return err
	}
	defer dp.close()
	dpool, err := b.poolOn(ctx, dbosDB, 3, dp.addr().String())
	if err != nil {
		return err
	}
	d, err := startDBOS(ctx, dpool, proc, "trips")
	if err != nil {
		dpool.Close()
		return err
	}
	defer d.shutdown()
	vs, err := callVariants(keys, d, proc, "r")
	if err != nil {
		return err
	}
	for _, v := range vs {
		for range 20 {
			if err := v.run(ctx); err != nil {
				return fmt.Errorf("%s warm-up: %w", v.name, err)
			}
		}
	}
	// What DBOS sends while it runs nothing (its pollers), per second.
	idle := 3 * time.Second
	before := dp.trips.Load()
	time.Sleep(idle)
	c.dbosIdle = float64(dp.trips.Load()-before) / idle.Seconds()
	n := b.opts.opTripOps
	for _, v := range vs {
		proxy := p
		if strings.HasPrefix(v.name, "DBOS") {
			proxy = dp
		}
		watch.mu.Lock()
		watch.trips = nil
		watch.mu.Unlock()
		t0, before := time.Now(), proxy.trips.Load()
		for range n {
			if err := v.run(ctx); err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
		}
		trips := float64(proxy.trips.Load() - before)
		if proxy == dp {
			trips -= c.dbosIdle * time.Since(t0).Seconds()
		}
		c.trips[v.name] = trips / float64(n)
		if v.name == "Operation" {
			watch.mu.Lock()
			var sum int64
			for _, t := range watch.trips {
				sum += t
			}
			if len(watch.trips) > 0 {
				c.stepTrips = float64(sum) / float64(len(watch.trips))
			}
			watch.mu.Unlock()
		}
	}
	return nil
}

// demoLatency is the processor's latency while contrast runs: long enough
// to send calls while the first is at the processor, and to see DBOS's
// polling.
const demoLatency = 1500 * time.Millisecond

// contrastLine is one call of the contrast and how it ended.
type contrastLine struct {
	who, call, answer string
	took              time.Duration
}

// contrast sends, under one key, a first charge, then while it is at the
// processor the same key with a changed amount and a duplicate, then both
// again once it finished: to the Operation, then to DBOS.
func contrast(ctx context.Context, op *idem.Operation[chargeReq, chargeResp], d *dbosBench) ([]contrastLine, error) {
	first, changed := chargeReq{Amount: chargeAmount}, chargeReq{Amount: 2 * chargeAmount}
	var lines []contrastLine
	add := func(who, call string, t0 time.Time, answer string) {
		lines = append(lines, contrastLine{who: who, call: call, answer: answer, took: time.Since(t0)})
	}
	opAnswer := func(r chargeResp, outcome idem.Outcome, err error) string {
		if err != nil {
			return fmt.Sprintf("%v: %v", outcome, err)
		}
		return fmt.Sprintf("%v: %s of %d", outcome, r.ChargeID, r.Amount)
	}

	// The Operation.
	key := "contrast-op"
	type opResult struct {
		r       chargeResp
		outcome idem.Outcome
		err     error
		at      time.Time
	}
	done := make(chan opResult, 1)
	t0 := time.Now()
	go func() {
		r, outcome, err := op.Run(ctx, key, first)
		done <- opResult{r, outcome, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	t := time.Now()
	r, outcome, err := op.Run(ctx, key, changed)
	add("Operation", "changed amount, while the first runs", t, opAnswer(r, outcome, err))
	t = time.Now()
	r, outcome, err = op.Run(ctx, key, first)
	add("Operation", "duplicate, while the first runs", t, opAnswer(r, outcome, err))
	res := <-done
	lines = append(lines, contrastLine{who: "Operation", call: "the first", answer: opAnswer(res.r, res.outcome, res.err), took: res.at.Sub(t0)})
	t = time.Now()
	r, outcome, err = op.Run(ctx, key, changed)
	add("Operation", "changed amount, after the first finished", t, opAnswer(r, outcome, err))
	t = time.Now()
	r, outcome, err = op.Run(ctx, key, first)
	add("Operation", "duplicate, after the first finished", t, opAnswer(r, outcome, err))

	// DBOS.
	id := "contrast-dbos"
	dbosAnswer := func(r chargeResp, err error) string {
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("no error: %s of %d", r.ChargeID, r.Amount)
	}
	type dbosResult struct {
		r   chargeResp
		err error
		at  time.Time
	}
	firstDone := make(chan dbosResult, 1)
	t0 = time.Now()
	go func() {
		r, err := d.runCharge(ctx, id, first)
		firstDone <- dbosResult{r, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	var dupChanged, dupSame dbosResult
	var wg sync.WaitGroup
	tDup := time.Now()
	wg.Add(2)
	go func() {
		defer wg.Done()
		r, err := d.runCharge(ctx, id, changed)
		dupChanged = dbosResult{r, err, time.Now()}
	}()
	go func() {
		defer wg.Done()
		r, err := d.runCharge(ctx, id, first)
		dupSame = dbosResult{r, err, time.Now()}
	}()
	wg.Wait()
	dres := <-firstDone
	after := func(x dbosResult) string {
		return fmt.Sprintf("%s; %.2f s after the first's answer", dbosAnswer(x.r, x.err), x.at.Sub(dres.at).Seconds())
	}
	lines = append(lines,
		contrastLine{who: "DBOS", call: "changed amount, while the first runs", answer: after(dupChanged), took: dupChanged.at.Sub(tDup)},
		contrastLine{who: "DBOS", call: "duplicate, while the first runs", answer: after(dupSame), took: dupSame.at.Sub(tDup)},
		contrastLine{who: "DBOS", call: "the first", answer: dbosAnswer(dres.r, dres.err), took: dres.at.Sub(t0)})
	t = time.Now()
	dr, err := d.runCharge(ctx, id, changed)
	add("DBOS", "changed amount, after the first finished", t, dbosAnswer(dr, err))
	t = time.Now()
	dr, err = d.runCharge(ctx, id, first)
	add("DBOS", "duplicate, after the first finished", t, dbosAnswer(dr, err))
	t = time.Now()
	dr, err = d.runCharge(ctx, id, first, dbosRejectExisting())
	add("DBOS", "duplicate, after, WorkflowIDReusePolicyReject", t, dbosAnswer(dr, err))
	return lines, ctx.Err()
}

// createDatabase creates database name, runs setup in it, and returns the
// function that drops it.
func (b *bench) createDatabase(ctx context.Context, name, setup string) (func(), error) {
	maint, err := pgx.ConnectConfig(ctx, b.server)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := maint.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			fmt.Fprintln(os.Stderr, "idem-bench: drop database:", err)
		}
		maint.Close(ctx)
	}
	if _, err := maint.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		maint.Close(ctx)
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	cfg := b.server.Copy()
	cfg.Database = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, setup); err != nil {
		drop()
		return nil, fmt.Errorf("set up %s: %w", name, err)
	}
	return drop, nil
}
