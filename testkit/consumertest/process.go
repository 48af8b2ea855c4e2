package consumertest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A Remote is a Broker that consumer instances in other processes can
// reach.
type Remote interface {
	Broker
	// Endpoint names the broker to an instance in another process (an
	// address and a topic, a URL, a queue): the dial function the test
	// binary passes to Child opens it there.
	Endpoint() string
}

// pause is how long an instance of a process storm waits after its
// handler's write and before each ack, so that a SIGKILL sent when it
// says it is there lands there.
const pause = 10 * time.Millisecond

// RunProcesses is Run with each consumer instance a process of its own:
// the test binary, started again as an instance (see Child) of mode
// "idem" or "bare" on the database at dbURL, consuming from b. Instances
// are killed with SIGKILL: KillsInHandler of them when one says its
// handler wrote (before COMMIT), KillsAfterCommit when one says its
// transaction answered (before the ack), at random among those moments.
// An instance that ran past the moment before the signal arrived counts
// as killed later. Each killed instance is replaced after a moment. pool
// is on dbURL, for the reconciliation and the backend terminations.
func (s Storm) RunProcesses(t testing.TB, mode string, b Remote, dbURL string, pool *pgxpool.Pool) Row {
	t.Helper()
	s.defaults()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(instanceConfig{Mode: mode, Database: dbURL, Endpoint: b.Endpoint(), Pause: pause})
	if err != nil {
		t.Fatal(err)
	}
	f := &processes{t: t, mode: mode, exe: exe, env: append(os.Environ(), instanceEnv+"="+string(raw)), instances: s.Instances}
	f.budget[phaseWrite].Store(int64(s.KillsInHandler))
	f.budget[phaseAck].Store(int64(s.KillsAfterCommit))
	// Spread the kills over about the first half of the storm.
	f.odds = max(s.Messages/(2*max(s.KillsInHandler, s.KillsAfterCommit, 1)), 2)
	return s.run(t, mode, b, pool, f)
}

// CompareProcesses is Compare with RunProcesses: each storm on a broker of
// its own from newBroker, the instances on the database at dbURL.
func (s Storm) CompareProcesses(t *testing.T, title, dbURL string, newBroker func(testing.TB) Remote) {
	t.Helper()
	s.defaults()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2 // the reconciliation and the terminations
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	withIdem := s.RunProcesses(t, "idem", newBroker(t), dbURL, pool)
	without := s.RunProcesses(t, "bare", newBroker(t), dbURL, pool)
	t.Log(title + " storm, instances as processes (SIGKILL):" + Table(withIdem, without))
	if !withIdem.Exact(s.Poison) {
		t.Errorf("with idem: %+v; want no duplicate, none lost, exactly the %d poison messages dead-lettered", withIdem, s.Poison)
	}
}

// The lines an instance says (see Child) where the storm may kill it, and
// what it says next of the same message if it ran past the kill.
const (
	phaseWrite = iota // "write": mid-handler, before COMMIT
	phaseAck          // "ack": COMMIT answered, before the ack
	phaseLater        // killed later than aimed
)

var (
	phaseLine = [2]string{"write", "ack"}
	nextLine  = [2]string{"ack", "settled"}
)

// processes is the fleet of RunProcesses.
type processes struct {
	t         testing.TB
	mode      string
	exe       string
	env       []string
	instances int
	odds      int // one line in odds of a phase is a kill, while its budget lasts

	budget     [2]atomic.Int64 // kills left, by phase
	kills      [3]atomic.Int64 // kills, by where they landed
	settledN   atomic.Int64    // "settled" lines
	lastSettle atomic.Int64    // when the last one came, in Unix nanoseconds
	joins      atomic.Int64
}

// quiet is how long without a settled delivery ends the storm once every
// message has its effect or is dead-lettered, when the count of settled
// deliveries falls short: an instance killed after its ack and before
// its "settled" line leaves it short for good.
const quiet = 5 * time.Second

func (f *processes) settled(published int) bool {
	last := f.lastSettle.Load()
	return f.settledN.Load() >= int64(published) || (last != 0 && time.Since(time.Unix(0, last)) > quiet)
}

func (f *processes) count(row *Row) {
	row.Kills = int(f.kills[phaseWrite].Load() + f.kills[phaseAck].Load() + f.kills[phaseLater].Load())
	row.Joins = int(f.joins.Load())
}

func (f *processes) run(ctx context.Context) {
	var wg sync.WaitGroup
	// Each slot keeps one instance running: a killed one is replaced (on
	// Kafka, the dead member's session expires and the new one joins, each
	// a rebalance).
	for range f.instances {
		wg.Go(func() {
			for ctx.Err() == nil {
				in, err := f.start()
				if err != nil {
					f.t.Errorf("%s instance: %v", f.mode, err)
					return
				}
				f.wait(ctx, in)
				sleep(ctx, time.Duration(20+rand.IntN(60))*time.Millisecond)
			}
		})
	}
	wg.Wait()
	f.t.Logf("%s: instances SIGKILLed mid-handler %d, between COMMIT and the ack %d, later than aimed %d",
		f.mode, f.kills[phaseWrite].Load(), f.kills[phaseAck].Load(), f.kills[phaseLater].Load())
}

// An instance is one consumer process.
type instance struct {
	f      *processes
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr tail
	done   chan struct{} // closed once it exited and its output was read
	err    error         // cmd.Wait's

	// Set by the goroutine that reads its output, read after done.
	killed    bool
	landed    int    // phaseWrite, phaseAck or phaseLater
	killedMsg string // the message it was handling
}

func (f *processes) start() (*instance, error) {
	// Stopped by the storm's SIGKILL, never by a context.
	cmd := exec.CommandContext(context.Background(), f.exe)
	cmd.Env = f.env
	in := &instance{f: f, cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &in.stderr
	var err error
	if in.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	f.joins.Add(1)
	go func() {
		defer close(in.done)
		in.read(stdout)
		in.err = cmd.Wait()
	}()
	return in, nil
}

// read follows the instance's lines until it exits: it counts settled
// deliveries, and kills the instance on a line where a kill is due.
func (in *instance) read(stdout io.Reader) {
	f := in.f
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line, msg, _ := strings.Cut(sc.Text(), " ")
		switch line {
		case "settled":
			f.settledN.Add(1)
			f.lastSettle.Store(time.Now().UnixNano())
		case "dead":
			if m, _, _ := strings.Cut(msg, " "); !Poisoned(m) {
				f.t.Logf("%s: dead-lettered %s", f.mode, msg)
			}
		}
		if in.killed {
			// A line of the killed message's next step, written before
			// the signal arrived: the kill landed later than aimed.
			if in.landed < phaseLater && msg == in.killedMsg && line == nextLine[in.landed] {
				in.landed = phaseLater
			}
			continue
		}
		for phase, name := range phaseLine {
			if line == name && !Poisoned(msg) && rand.IntN(f.odds) == 0 && f.budget[phase].Add(-1) >= 0 {
				_ = in.cmd.Process.Kill() // SIGKILL
				in.killed, in.landed, in.killedMsg = true, phase, msg
				break
			}
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	if in.killed {
		f.kills[in.landed].Add(1)
	}
}

// wait waits until the instance has exited; when ctx ends first, it closes
// the instance's standard input, which stops it. It fails the test if the
// instance ended in another way than by a kill or that stop, or its race
// detector reported.
func (f *processes) wait(ctx context.Context, in *instance) {
	stopped := false
	select {
	case <-in.done:
	case <-ctx.Done():
		stopped = true
		_ = in.stdin.Close()
		select {
		case <-in.done:
		case <-time.After(30 * time.Second):
			// SIGQUIT: the Go runtime prints every goroutine's stack.
			_ = in.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-in.done:
			case <-time.After(10 * time.Second):
				_ = in.cmd.Process.Kill()
				<-in.done
			}
			f.t.Errorf("a %s instance did not stop within 30s of the end of its input; its stderr:\n%s", f.mode, in.stderr.String())
			return
		}
	}
	_ = in.stdin.Close()
	switch {
	case strings.Contains(in.stderr.String(), "WARNING: DATA RACE"):
		f.t.Errorf("a %s instance's race detector reported; its stderr:\n%s", f.mode, in.stderr.String())
	case in.killed:
	case !stopped || in.err != nil:
		f.t.Errorf("a %s instance ended (%v) unasked; its stderr:\n%s", f.mode, in.err, in.stderr.String())
	}
}

// tail keeps the last 256 KiB written to it (a goroutine dump included).
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if n := len(t.buf) - 256<<10; n > 0 {
		t.buf = append(t.buf[:0], t.buf[n:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
