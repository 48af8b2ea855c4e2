package consumertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idemconsume"
)

// instanceEnv holds, as JSON, the settings of one consumer instance of a
// process storm: the test binary started with it set is that instance,
// and runs no test.
const instanceEnv = "IDEM_TEST_STORM_INSTANCE"

// instanceConfig is what an instance runs.
type instanceConfig struct {
	Mode     string        // "idem" or "bare"
	Database string        // the storm's database
	Endpoint string        // the broker, as its Remote.Endpoint names it
	Pause    time.Duration // after the handler's write, and before the ack
}

// ConsumeFunc runs one consumer instance with p until ctx ends, as
// Broker.Consume does.
type ConsumeFunc func(ctx context.Context, p idemconsume.Processor) error

// Child makes the test binary a consumer instance of a process storm
// (RunProcesses) when the storm started it, and returns at once otherwise.
// A test binary that runs process storms calls it first in TestMain, so
// that an instance creates no database and runs no test:
//
//	func TestMain(m *testing.M) {
//		consumertest.Child(dial)
//		os.Exit(testdb.Main(m))
//	}
//
// dial returns how to consume from the broker that endpoint names
// (Remote.Endpoint). The instance consumes until its standard input ends
// (the storm closed it, or the storm's process died), then exits 0. It
// tells the storm what it does on its standard output, a line each:
// "write <msg>" when the handler wrote and pauses before COMMIT, "ack
// <msg>" when the transaction answered and it pauses before the ack,
// "settled <msg>" once the delivery is acked or dead-lettered, and "dead
// <msg> <reason>" for a dead letter.
func Child(dial func(endpoint string) ConsumeFunc) {
	raw := os.Getenv(instanceEnv)
	if raw == "" {
		return
	}
	os.Exit(runInstance(raw, dial))
}

func runInstance(raw string, dial func(endpoint string) ConsumeFunc) int {
	var cfg instanceConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		return 2
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	pc, err := pgxpool.ParseConfig(cfg.Database)
	if err != nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		return 2
	}
	// One connection per partition a Kafka instance processes at once; the
	// other adapters process one message at a time.
	pc.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		return 1
	}
	defer pool.Close()
	out := &reporter{w: os.Stdout, pause: cfg.Pause}
	c, bare, err := processors(pool, out.handler(Handler(Poisoned)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		return 2
	}
	var p idemconsume.Processor = c
	if cfg.Mode == "bare" {
		p = bare
	}
	if err := dial(cfg.Endpoint)(ctx, out.processor(p)); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		return 1
	}
	return 0
}

// reporter writes an instance's lines, and pauses where the storm kills.
type reporter struct {
	mu    sync.Mutex
	w     io.Writer
	pause time.Duration
}

func (r *reporter) say(phase, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = fmt.Fprintf(r.w, "%s %s\n", phase, msg)
}

// handler says "write" once h wrote, and pauses there: a SIGKILL on that
// line lands mid-handler, before COMMIT.
func (r *reporter) handler(h idemconsume.Handler) idemconsume.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
		if err := h(ctx, tx, m); err != nil {
			return err
		}
		r.say("write", string(m.Payload))
		sleep(ctx, r.pause)
		return nil
	}
}

// processor says "ack" when p acks, and pauses before the broker hears of
// it (a SIGKILL then lands between COMMIT and the ack), and "settled" once
// the delivery is settled.
func (r *reporter) processor(p idemconsume.Processor) idemconsume.Processor {
	return processorFunc(func(ctx context.Context, m *idemconsume.Message, s idemconsume.Settler) (idemconsume.Result, error) {
		msg := string(m.Payload)
		res, err := p.Process(ctx, m, &pausing{Settler: s, before: func() {
			r.say("ack", msg)
			sleep(ctx, r.pause)
		}})
		if err == nil && (res.Action == idemconsume.Ack || res.Action == idemconsume.DeadLetter) {
			if res.Action == idemconsume.DeadLetter {
				r.say("dead", fmt.Sprintf("%s on delivery %d: %v", msg, m.Deliveries, res.Err))
			}
			r.say("settled", msg)
		}
		return res, err
	})
}

// pausing runs before ahead of each Ack.
type pausing struct {
	idemconsume.Settler
	before func()
}

func (s *pausing) Ack(ctx context.Context) error {
	s.before()
	return s.Settler.Ack(ctx)
}
