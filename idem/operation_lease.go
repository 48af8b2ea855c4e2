package idem

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A lease is an owner's hold on an operation (operation.go): a fencing
// token, renewed every third of its length while the owner works by its
// Operation's renewer. When a renewal finds the token no longer the
// operation's (another owner took it over after this one paused past its
// lease, or the key was forgotten), it ends ctx with ErrLeaseLost, and
// every record this owner would still make fails on the token anyway: the
// renewal makes the owner stop sooner, and the fence before each step
// (operation_fence.sql, operation_call.sql) keeps it from starting another.
type lease struct {
	r      *renewer
	scope  string
	key    string
	token  int64
	micros int64
	every  time.Duration
	ctx    context.Context
	cancel context.CancelCauseFunc
	once   sync.Once
	gone   atomic.Bool
	due    time.Time // the next renewal; guarded by r.mu
}

// startLease starts renewing the lease of token.
func (o *Operation[Req, Resp]) startLease(ctx context.Context, c *call, token int64) *lease {
	lctx, cancel := context.WithCancelCause(ctx)
	l := &lease{r: o.renewer, scope: c.scope, key: c.key, token: token, micros: o.lease.Microseconds(),
		every: o.lease / 3, ctx: lctx, cancel: cancel}
	o.renewer.add(l)
	return l
}

// lose marks the lease lost and ends the owner's context.
func (l *lease) lose() {
	l.gone.Store(true)
	l.cancel(ErrLeaseLost)
}

// lost reports whether another owner took the operation over.
func (l *lease) lost() bool { return l.gone.Load() }

// stop ends the renewals; the owner is done.
func (l *lease) stop() {
	l.once.Do(func() {
		l.r.remove(l)
		l.cancel(nil)
	})
}

// A renewer renews the leases of one Operation's owners at work, all in
// one statement (operation_renew.sql) per round, on a connection of its own
// rather than the pool's: a pool exhausted by the work (load, or clients
// flooding slow requests) must not keep a live owner from renewing, or
// another replica would take its operation over while its external call
// goes through. The connection is opened, by the goroutine that renews,
// as soon as an owner starts (off the owner's path, and ready before the
// first renewal falls due), and closed with that goroutine shortly after
// the last owner stopped (renewLinger), so that back-to-back operations
// share it.
type renewer struct {
	pool *pgxpool.Pool
	// op is the statements of the key table's layout, set by checkLayout
	// before the first owner starts.
	op atomic.Pointer[opSQL]

	mu      sync.Mutex
	leases  map[*lease]struct{}
	running bool
	wake    chan struct{}
}

func newRenewer(pool *pgxpool.Pool) *renewer {
	return &renewer{pool: pool, leases: map[*lease]struct{}{}, wake: make(chan struct{}, 1)}
}

func (r *renewer) add(l *lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l.due = time.Now().Add(l.every)
	r.leases[l] = struct{}{}
	if !r.running {
		r.running = true
		go r.run()
		return
	}
	r.poke()
}

func (r *renewer) remove(l *lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.leases, l)
	if len(r.leases) == 0 {
		r.poke() // let the goroutine end now
	}
}

func (r *renewer) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// renewLinger is how long the renewer keeps its connection after the last
// owner stopped, for the next operation to start.
const renewLinger = 100 * time.Millisecond

// run renews leases as they fall due, until none has been left for
// renewLinger.
func (r *renewer) run() {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
		}
	}()
	conn = r.connect(conn, DefaultLease)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var idleSince time.Time
	for {
		batch, wait, idle := r.due(idleSince)
		switch {
		case idle && wait < 0:
			return
		case idle && idleSince.IsZero():
			idleSince = time.Now()
		case !idle:
			idleSince = time.Time{}
		}
		if len(batch) > 0 {
			conn = r.renew(conn, batch)
			continue
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-r.wake:
		}
	}
}

// due takes the leases whose renewal falls due within half their interval,
// moving their next renewal on, or else says how long to wait for the
// next. With no lease left (idle), it says how long to linger from
// idleSince, and wait < 0 once that has passed: the renewer stops, and
// the next owner starts another.
func (r *renewer) due(idleSince time.Time) (batch []*lease, wait time.Duration, idle bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if len(r.leases) == 0 {
		if !idleSince.IsZero() && now.Sub(idleSince) >= renewLinger {
			r.running = false
			return nil, -1, true
		}
		return nil, renewLinger, true
	}
	wait = time.Hour
	for l := range r.leases {
		if until := l.due.Sub(now); until > l.every/2 {
			wait = min(wait, until-l.every/2)
			continue
		}
		l.due = now.Add(l.every)
		batch = append(batch, l)
	}
	return batch, wait, false
}

// connect returns conn, or a new connection if conn is nil, within
// timeout; nil if none could be opened (the next round tries again).
func (r *renewer) connect(conn *pgx.Conn, timeout time.Duration) *pgx.Conn {
	if conn != nil {
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := connectLike(ctx, r.pool)
	if err != nil {
		return nil
	}
	return conn
}

// renew sends one renewal for batch on conn (connecting it first if need
// be) and marks lost the leases whose token is gone. It returns the
// connection to use next time: nil after a failure, which is not a lost
// lease: the next renewal may pass, and every record is fenced regardless.
func (r *renewer) renew(conn *pgx.Conn, batch []*lease) *pgx.Conn {
	length := 3 * batch[0].every
	scopes, keys := make([]string, len(batch)), make([]string, len(batch))
	tokens, micros := make([]int64, len(batch)), make([]int64, len(batch))
	for i, l := range batch {
		scopes[i], keys[i], tokens[i], micros[i] = l.scope, l.key, l.token, l.micros
		length = min(length, 3*l.every)
	}
	// No caller's context governs the renewer, which serves every owner
	// of the Operation; a round is bounded by the shortest lease instead,
	// past which its renewal would come too late anyway.
	if conn = r.connect(conn, length); conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), length)
	defer cancel()
	op := r.op.Load()
	if op.onCitus() {
		return r.renewEach(ctx, conn, op.renew, batch)
	}
	rows, _ := conn.Query(ctx, op.renew, scopes, keys, tokens, micros)
	lost, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		_ = conn.Close(ctx)
		return nil
	}
	for _, i := range lost {
		batch[i-1].lose()
	}
	return conn
}

// renewEach is renew on a Citus cluster: one statement per lease, each
// routed to its key's shard, all in one pipeline (operation_renew_citus.sql).
func (r *renewer) renewEach(ctx context.Context, conn *pgx.Conn, sql string, batch []*lease) *pgx.Conn {
	var b pgx.Batch
	lost := make([]bool, len(batch))
	for i, l := range batch {
		b.Queue(sql, l.scope, l.key, l.token, l.micros).QueryRow(func(row pgx.Row) error {
			return row.Scan(&lost[i])
		})
	}
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		_ = conn.Close(ctx)
		return nil
	}
	for i, gone := range lost {
		if gone {
			batch[i].lose()
		}
	}
	return conn
}

// connectLike opens a connection outside pool with pool's settings and
// hooks, as the pool would open one.
func connectLike(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	cfg := pool.Config()
	if cfg.BeforeConnect != nil {
		if err := cfg.BeforeConnect(ctx, cfg.ConnConfig); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, err
	}
	if cfg.AfterConnect != nil {
		if err := cfg.AfterConnect(ctx, conn); err != nil {
			_ = conn.Close(ctx)
			return nil, err
		}
	}
	return conn, nil
}
