package idem

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A lease is an owner's hold on an operation (operation.go): a fencing
// token, and a goroutine that renews the lease every third of its length
// while the owner works. When a renewal finds the token no longer the
// operation's (another owner took it over after this one paused past its
// lease), it ends ctx with ErrLeaseLost, and every record this owner would
// still make fails on the token anyway: the renewal only makes the owner
// stop sooner.
type lease struct {
	token  int64
	micros int64
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
	once   sync.Once
	gone   atomic.Bool
}

func (o *Operation[Req, Resp]) startLease(ctx context.Context, c *call, token int64) *lease {
	lctx, cancel := context.WithCancelCause(ctx)
	l := &lease{token: token, micros: o.lease.Microseconds(), ctx: lctx, cancel: cancel, done: make(chan struct{})}
	go l.renew(c, o.pool, o.lease/3)
	return l
}

func (l *lease) renew(c *call, pool *pgxpool.Pool, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		tag, err := pool.Exec(l.ctx, c.stmts.op.renew, c.scope, c.key, l.token, l.micros)
		if err == nil && tag.RowsAffected() == 0 {
			l.lose()
			return
		}
		// A failed renewal (the database unreachable) is not a lost lease:
		// the next one may pass, and the records are fenced regardless.
	}
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
		close(l.done)
		l.cancel(nil)
	})
}
