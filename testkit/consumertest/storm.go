package consumertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idemconsume"
)

// A Broker is what the storm needs of an adapter under test.
type Broker interface {
	// Publish publishes payload with the producer id id.
	Publish(ctx context.Context, id string, payload []byte) error
	// Consume runs one consumer instance with p until ctx ends, and returns
	// once the instance has stopped (its connection closed, as a killed
	// process's would be).
	Consume(ctx context.Context, p idemconsume.Processor) error
	// DeadLetters returns the payloads dead-lettered so far.
	DeadLetters(ctx context.Context) ([]string, error)
}

// Storm is one storm's shape. Zero fields take the defaults.
type Storm struct {
	Messages   int // published once each; default 200
	Duplicates int // of those, published a second time with the same id (a producer's retry); default Messages/10
	Poison     int // of those, failing every time; default 3
	Instances  int // consumer instances running at once; default 3
	// KillsInHandler and KillsAfterCommit are how many instances are
	// killed mid-handler (before COMMIT) and between COMMIT and the ack;
	// default 4 each. A killed instance is replaced after a moment.
	KillsInHandler, KillsAfterCommit int
	// Terminations is how many times the database backend of a handler's
	// transaction is terminated (pg_terminate_backend) while the
	// transaction is open; default 5.
	Terminations int
	// Deadline bounds the storm; default 60s.
	Deadline time.Duration
}

// Row is the reconciliation of one storm.
type Row struct {
	Mode         string
	Published    int // publishes, duplicates included
	Kills        int // instances killed
	Terminated   int // backends terminated mid-transaction
	Joins        int // instances started, the first ones included
	Effects      int // rows in the effects table
	DupEffects   int // rows beyond one per message
	Lost         int // messages that are neither in the table nor dead-lettered
	DeadLettered int // distinct messages dead-lettered
	WrongDead    int // dead-lettered messages that were not poison
	Elapsed      time.Duration
}

// Exact reports whether the storm ended as the guarantee says: every
// message's effect once, none lost, exactly the poison ones dead-lettered.
func (r Row) Exact(poison int) bool {
	return r.DupEffects == 0 && r.Lost == 0 && r.WrongDead == 0 && r.DeadLettered == poison
}

// Table renders rows for t.Log.
func Table(rows ...Row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-6s %9s %5s %5s %10s %7s %11s %4s %13s %10s %8s\n",
		"mode", "published", "kills", "joins", "terminated", "effects", "dup effects", "lost", "dead-lettered", "wrong dead", "elapsed")
	for _, r := range rows {
		fmt.Fprintf(&b, "%-6s %9d %5d %5d %10d %7d %11d %4d %13d %10d %8s\n", r.Mode, r.Published, r.Kills, r.Joins, r.Terminated,
			r.Effects, r.DupEffects, r.Lost, r.DeadLettered, r.WrongDead, r.Elapsed.Round(10*time.Millisecond))
	}
	return b.String()
}

func (s *Storm) defaults() {
	if s.Messages == 0 {
		s.Messages = 200
	}
	if s.Duplicates == 0 {
		s.Duplicates = s.Messages / 10
	}
	if s.Poison == 0 {
		s.Poison = 3
	}
	if s.Instances == 0 {
		s.Instances = 3
	}
	if s.KillsInHandler == 0 {
		s.KillsInHandler = 4
	}
	if s.KillsAfterCommit == 0 {
		s.KillsAfterCommit = 4
	}
	if s.Terminations == 0 {
		s.Terminations = 5
	}
	if s.Deadline == 0 {
		s.Deadline = 60 * time.Second
	}
}

// Poisoned reports whether msg is one of the storm's poison messages.
func Poisoned(msg string) bool { return strings.HasPrefix(msg, "poison-") }

// Run runs the storm on b with p (an idem consumer, or a Bare one, whose
// handler is Handler(Poisoned)), reconciles it from pool's effects table,
// which it empties first, and returns the row, named mode. Its instances
// run in the test process; a kill ends one by its context.
func (s Storm) Run(t testing.TB, mode string, b Broker, pool *pgxpool.Pool, p idemconsume.Processor) Row {
	t.Helper()
	s.defaults()
	k := &killer{p: p, t: t}
	k.inHandler.Store(int64(s.KillsInHandler))
	k.afterCommit.Store(int64(s.KillsAfterCommit))
	return s.run(t, mode, b, pool, &inProcess{t: t, b: b, k: k, instances: s.Instances})
}

// A fleet runs a storm's consumer instances: it keeps Storm.Instances of
// them running, kills some and replaces each killed one.
type fleet interface {
	// run runs the instances until ctx ends and returns once every one
	// has stopped.
	run(ctx context.Context)
	// settled reports whether the instances settled (acked or
	// dead-lettered) every one of published publishes, as far as the
	// fleet can tell.
	settled(published int) bool
	// count fills row's Kills and Joins.
	count(row *Row)
}

// run is the storm with its instances run by f.
func (s *Storm) run(t testing.TB, mode string, b Broker, pool *pgxpool.Pool, f fleet) Row {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), s.Deadline)
	defer cancel()
	if _, err := pool.Exec(ctx, EffectsSQL+"; TRUNCATE effects"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	msgs := make([]string, s.Messages)
	for i := range msgs {
		msgs[i] = fmt.Sprintf("m%05d", i)
		if i%(s.Messages/s.Poison) == s.Messages/s.Poison/2 && i/(s.Messages/s.Poison) < s.Poison {
			msgs[i] = "poison-" + msgs[i]
		}
	}
	row := Row{Mode: mode, Published: s.Messages + s.Duplicates}
	var terminated atomic.Int64

	var wg sync.WaitGroup
	defer wg.Wait()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	wg.Go(func() { f.run(runCtx) })
	// The database: backends terminated in the middle of a handler's
	// transaction, a technical failure (or, during COMMIT, an unknown
	// outcome) that the next delivery must repair.
	wg.Go(func() {
		for terminated.Load() < int64(s.Terminations) && runCtx.Err() == nil {
			sleep(runCtx, 100*time.Millisecond)
			var n int64
			err := pool.QueryRow(runCtx, `SELECT count(pg_terminate_backend(pid)) FROM (
				SELECT pid FROM pg_stat_activity WHERE datname = current_database()
				AND state = 'idle in transaction' AND pid <> pg_backend_pid() LIMIT 1) AS one`).Scan(&n)
			if err == nil {
				terminated.Add(n)
			}
		}
	})
	// The producer: every message, and a second publish of some (a retry
	// whose first answer was lost), interleaved with the consumers' work.
	pub := func(i int) {
		if err := b.Publish(ctx, "id-"+msgs[i], []byte(msgs[i])); err != nil {
			t.Errorf("publish %s: %v", msgs[i], err)
		}
	}
	for i := range msgs {
		pub(i)
		if i >= s.Messages/2 && i-s.Messages/2 < s.Duplicates {
			pub(i - s.Messages/2)
		}
	}

	// The storm is over when every publish was settled (acked or
	// dead-lettered) once and every message has its effect or is dead.
	for {
		dead, err := b.DeadLetters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		effects := s.reconcile(t, ctx, pool, msgs, dead, &row)
		if f.settled(row.Published) && effects {
			break
		}
		if ctx.Err() != nil {
			t.Errorf("%s storm: not settled within %v; %+v", mode, s.Deadline, row)
			break
		}
		sleep(ctx, 50*time.Millisecond)
	}
	// Let late redeliveries (a duplicate publish queued behind a kill)
	// arrive before the final count.
	sleep(ctx, 300*time.Millisecond)
	stop()
	wg.Wait()
	dead, err := b.DeadLetters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.reconcile(t, context.Background(), pool, msgs, dead, &row)
	f.count(&row)
	row.Terminated = int(terminated.Load())
	row.Elapsed = time.Since(start)
	return row
}

// inProcess is the fleet of Run: instances in the test process, killed by
// cancelling their context.
type inProcess struct {
	t         testing.TB
	b         Broker
	k         *killer
	instances int
	joins     atomic.Int64
}

func (f *inProcess) run(ctx context.Context) {
	var wg sync.WaitGroup
	// Each slot keeps one instance running: a killed one is replaced (a
	// consumer leaves and another joins, which rebalances a Kafka group).
	for slot := range f.instances {
		wg.Go(func() {
			for ctx.Err() == nil {
				inst, kill := context.WithCancel(ctx)
				f.joins.Add(1)
				if err := f.b.Consume(inst, f.k.wrap(kill)); err != nil && inst.Err() == nil {
					f.t.Errorf("instance of slot %d: %v", slot, err)
				}
				kill()
				sleep(ctx, time.Duration(20+rand.IntN(60))*time.Millisecond)
			}
		})
	}
	wg.Wait()
}

func (f *inProcess) settled(published int) bool { return f.k.settled.Load() >= int64(published) }

func (f *inProcess) count(row *Row) {
	row.Kills = int(f.k.kills.Load())
	row.Joins = int(f.joins.Load())
}

// reconcile fills row from the effects table and the dead letters, and
// reports whether every message is accounted for.
func (s *Storm) reconcile(t testing.TB, ctx context.Context, pool *pgxpool.Pool, msgs, dead []string, row *Row) bool {
	t.Helper()
	count := map[string]int{}
	rows, err := pool.Query(ctx, "SELECT msg, count(*) FROM effects WHERE consumer = $1 GROUP BY msg", Name)
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		t.Fatal(err)
	}
	for rows.Next() {
		var m string
		var n int
		if err := rows.Scan(&m, &n); err != nil {
			t.Fatal(err)
		}
		count[m] = n
	}
	if err := rows.Err(); err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
	slices.Sort(dead)
	dead = slices.Compact(dead)
	row.Effects, row.DupEffects, row.Lost, row.WrongDead = 0, 0, 0, 0
	row.DeadLettered = len(dead)
	for _, m := range msgs {
		row.Effects += count[m]
		row.DupEffects += max(count[m]-1, 0)
		_, isDead := slices.BinarySearch(dead, m)
		if count[m] == 0 && !isDead {
			row.Lost++
		}
		if isDead && !Poisoned(m) {
			row.WrongDead++
		}
	}
	return row.Lost == 0
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

type killKey struct{}

// killer wraps a Processor: it counts settled publishes and kills instances,
// each kill spending one of its budgets.
type killer struct {
	p                      idemconsume.Processor
	t                      testing.TB
	inHandler, afterCommit atomic.Int64
	settled                atomic.Int64 // publishes settled (acked or dead-lettered)
	kills                  atomic.Int64 // instances killed
}

// errKilled is what a killed instance's Ack returns: the process died
// before the broker heard of the commit.
var errKilled = errors.New("consumertest: the instance was killed after COMMIT, before the ack")

// wrap returns the Processor of one instance, which kill ends.
func (k *killer) wrap(cancel context.CancelFunc) idemconsume.Processor {
	var once sync.Once
	kill := context.CancelFunc(func() { once.Do(func() { k.kills.Add(1); cancel() }) })
	one := processorFunc(func(ctx context.Context, m *idemconsume.Message, s idemconsume.Settler) (idemconsume.Result, error) {
		poison := Poisoned(string(m.Payload))
		if !poison && rand.IntN(8) == 0 && k.inHandler.Add(-1) >= 0 {
			ctx = context.WithValue(ctx, killKey{}, kill)
		}
		st := &settler{Settler: s}
		if !poison && rand.IntN(8) == 0 && k.afterCommit.Add(-1) >= 0 {
			st.kill = kill
		}
		res, err := k.p.Process(ctx, m, st)
		if res.Action == idemconsume.DeadLetter && !poison {
			k.t.Logf("%s dead-lettered on delivery %d: %v", m.Payload, m.Deliveries, res.Err)
		}
		if err == nil && (res.Action == idemconsume.Ack || res.Action == idemconsume.DeadLetter) {
			k.settled.Add(1)
		}
		return res, err
	})
	if bp, ok := k.p.(idemconsume.BatchProcessor); ok {
		return &batchKiller{k: k, one: one, bp: bp, kill: kill}
	}
	return one
}

type processorFunc func(ctx context.Context, m *idemconsume.Message, s idemconsume.Settler) (idemconsume.Result, error)

func (f processorFunc) Process(ctx context.Context, m *idemconsume.Message, s idemconsume.Settler) (idemconsume.Result, error) {
	return f(ctx, m, s)
}

// settler kills its instance instead of acking when kill is set.
type settler struct {
	idemconsume.Settler
	kill context.CancelFunc
}

func (s *settler) Ack(ctx context.Context) error {
	if s.kill != nil {
		s.kill()
		return errKilled
	}
	return s.Settler.Ack(ctx)
}

// Long is the storm of make test-long: 3000 messages, 300 of them
// published twice, five instances, 40 kills.
func Long() Storm {
	return Storm{Messages: 3000, Instances: 5, KillsInHandler: 20, KillsAfterCommit: 20, Deadline: 5 * time.Minute}
}

// Processors returns the storm's idem consumer and the bare one, with
// Handler(Poisoned) and the same retry rules. MaxDeliveries is 10 rather
// than the default 5: a killed instance's prefetched messages come back
// too, and some brokers count each return as a delivery.
func Processors(t testing.TB, pool *pgxpool.Pool) (*idemconsume.Consumer, *Bare) {
	t.Helper()
	c, bare, err := processors(pool, Handler(Poisoned))
	if err != nil {
		t.Fatal(err)
	}
	return c, bare
}

// processors is Processors with the handler h, for the instances of a
// process storm, which have no testing.TB.
func processors(pool *pgxpool.Pool, h idemconsume.Handler) (*idemconsume.Consumer, *Bare, error) {
	c, err := idemconsume.New(pool, &idemconsume.Config{
		Name: Name, MaxDeliveries: 10, InProgressDelay: 50 * time.Millisecond,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
	}, h)
	if err != nil {
		return nil, nil, err
	}
	return c, &Bare{DB: pool, Handler: h, Max: 10, Backoff: 10 * time.Millisecond}, nil
}

// Compare runs the storm with the idem consumer and then with the bare one,
// each on a broker of its own from newBroker, logs both rows as a table
// under title, and fails t unless the idem row is exact.
func (s Storm) Compare(t *testing.T, title string, pool *pgxpool.Pool, newBroker func(testing.TB) Broker) {
	t.Helper()
	s.defaults()
	c, bare := Processors(t, pool)
	withIdem := s.Run(t, "idem", newBroker(t), pool, c)
	without := s.Run(t, "bare", newBroker(t), pool, bare)
	t.Log(title + " storm:" + Table(withIdem, without))
	if !withIdem.Exact(s.Poison) {
		t.Errorf("with idem: %+v; want no duplicate, none lost, exactly the %d poison messages dead-lettered", withIdem, s.Poison)
	}
}
