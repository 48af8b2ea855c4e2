package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A Beginner begins transactions. *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and
// pgx.Tx all satisfy it; given a pgx.Tx, Do runs in a savepoint of that
// outer transaction and the key commits when the outer transaction does.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Do runs fn at most once per key and returns its result to every call with
// that key, for as long as the key lives (see WithTTL).
//
// Do opens one transaction on db, claims key in it as 'in_progress', runs fn
// in the same transaction, stores fn's result (encoded as JSON, or with the
// type's MarshalBinary) and commits. The key, fn's writes and the stored
// result commit together or not at all. A later call with the same key and
// request hash returns the stored result without running fn; WithReplayed
// tells the caller which happened.
//
// reqHash fingerprints the request (see HashJSON and HashBytes): the same
// key with another hash returns ErrMismatch and fn does not run.
//
// Outcomes:
//   - fn returns nil: the result is stored and returned.
//   - fn returns an error wrapping a *Refusal: fn's writes roll back, the key
//     commits with the refusal and fn's value, and Do returns both as fn
//     returned them. Replays return the value and an equal *Refusal.
//   - fn returns any other error, or panics, or ctx ends, or the result cannot
//     be encoded, or COMMIT fails: everything rolls back, no trace of the key
//     remains, and the same key may be retried. fn's error is returned as it
//     is; a panic is re-raised after the rollback.
//   - The connection fails while COMMIT is under way: the error wraps
//     ErrOutcomeUnknown. Retry with the same key to learn the outcome.
//   - Another transaction holds the key: ErrInProgress at once, without
//     waiting for it (unless WithWait).
//   - Invalid key, scope, hash or option: an error wrapping ErrInvalidKey,
//     ErrInvalidScope, ErrInvalidRequestHash, ErrInvalidTable or
//     ErrInvalidOption, before any database work.
//
// fn receives the transaction and must do all its database work through it.
// It must not commit or roll it back (both return ErrTxOwned) nor keep it
// after returning. fn may run again after a failed attempt, so effects
// outside the database (a call to a payment gateway) need their own
// idempotency key, derived from key.
//
// ctx governs every database call Do makes; fn should observe it too. When
// ctx ends, the transaction rolls back; a rollback is sent with ctx's values
// but without its cancellation, so the connection is left clean.
//
// With a pool or a connection, a first execution costs no round trip beyond
// those of a bare transaction doing fn's work: the claim travels with BEGIN,
// and the stored result with COMMIT. A replay is one round trip that takes no
// lock and writes nothing.
func Do[T any](ctx context.Context, db Beginner, key, reqHash string, fn func(pgx.Tx) (T, error), opts ...Option) (T, error) {
	var zero T
	cfg := newConfig(opts)
	if cfg.replayed != nil {
		*cfg.replayed = false
	}
	c, err := newCall(&cfg, key, reqHash)
	if err != nil {
		return zero, err
	}
	if db == nil || fn == nil {
		return zero, inputError(ErrInvalidOption, "Do needs a database and a function")
	}
	if err := ctx.Err(); err != nil {
		return zero, err
	}

	var deadline time.Time
	if cfg.wait > 0 {
		deadline = time.Now().Add(cfg.wait)
	}
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, 250*time.Millisecond) {
		v, err := attempt(ctx, db, c, fn)
		if !errors.Is(err, ErrInProgress) || cfg.wait == 0 {
			return v, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return v, err
		}
		// Jitter keeps waiters on one key from polling in lockstep.
		sleep := min(left, backoff/2+rand.N(backoff/2+1))
		if err := sleepCtx(ctx, sleep); err != nil {
			return zero, err
		}
	}
}

// call is one validated Do call, free of the result type.
type call struct {
	cfg      config
	stmts    *statements
	key      string
	reqHash  string
	lock     int64
	ttlMicro int64
	begin    string

	// What every attempt sends and scans lives here, allocated once with the
	// call: the arguments boxed once (scope and key go out three times), the
	// two pipelines with room for their statements, and the claim's targets.
	scopeArg, keyArg any
	claimArgv        [5]any
	first, last      pgx.Batch
	firstQ           [4]*pgx.QueuedQuery
	lastQ            [3]*pgx.QueuedQuery
	scan             claimTargets
}

func newCall(cfg *config, key, reqHash string) (*call, error) {
	if cfg.err != nil {
		return nil, cfg.err
	}
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if err := validateScope(cfg.scope); err != nil {
		return nil, err
	}
	if err := validateRequestHash(reqHash); err != nil {
		return nil, err
	}
	stmts, err := statementsFor(cfg.table)
	if err != nil {
		return nil, err
	}
	c := &call{
		cfg:      *cfg,
		stmts:    stmts,
		key:      key,
		reqHash:  reqHash,
		lock:     lockID(cfg.table, cfg.scope, key),
		ttlMicro: cfg.ttl.Microseconds(),
		begin:    beginSQL(cfg.txOpts),
		scopeArg: cfg.scope,
		keyArg:   key,
	}
	c.claimArgv = [5]any{c.lock, c.scopeArg, c.keyArg, reqHash, c.ttlMicro}
	return c, nil
}

func (c *call) claimArgs() []any { return c.claimArgv[:] }

// batch empties b and gives it room for the statements of one pipeline.
func batch(b *pgx.Batch, room []*pgx.QueuedQuery) *pgx.Batch {
	*b = pgx.Batch{QueuedQueries: room[:0]}
	return b
}

func attempt[T any](ctx context.Context, db Beginner, c *call, fn func(pgx.Tx) (T, error)) (T, error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		conn, err := d.Acquire(ctx)
		if err != nil {
			var zero T
			return zero, fmt.Errorf("idem: acquire a connection: %w", err)
		}
		// Release discards a connection left inside a transaction, so an
		// attempt that could not clean up never poisons the pool.
		defer conn.Release()
		return onConn(ctx, conn.Conn(), c, fn)
	case *pgxpool.Conn:
		return onConn(ctx, d.Conn(), c, fn)
	case *pgx.Conn:
		return onConn(ctx, d, c, fn)
	default:
		return onBeginner(ctx, db, c, fn)
	}
}

// record is a live row read back for a replay.
type record struct {
	requestHash string
	status      string
	response    []byte
	refusal     []byte
}

// claim is what the claim statement answered.
type claim struct {
	locked  *bool // nil: a live row made locking needless
	claimed bool
	rec     *record
}

// claimTargets are the destinations the claim's row is scanned into.
type claimTargets struct {
	locked            *bool
	claimed           bool
	hash, status      *string
	response, refusal []byte
}

func (c *call) scanClaim(row pgx.Row) (claim, error) {
	t := &c.scan
	*t = claimTargets{}
	if err := row.Scan(&t.locked, &t.claimed, &t.hash, &t.status, &t.response, &t.refusal); err != nil {
		return claim{}, err
	}
	cl := claim{locked: t.locked, claimed: t.claimed}
	if t.hash != nil {
		cl.rec = &record{requestHash: *t.hash, status: *t.status, response: t.response, refusal: t.refusal}
	}
	return cl, nil
}

// onConn runs the pipelined protocol on a connection outside a transaction.
//
//	round trip 1: claim; assert_claimed; BEGIN; SAVEPOINT idem_work
//	fn's own round trips
//	last round trip: [ROLLBACK TO SAVEPOINT idem_work;] complete; COMMIT
//
// The claim runs in the implicit transaction that the extended protocol opens
// for the pipeline; BEGIN turns it into an explicit one that keeps the claim.
// When the key is not claimed, assert_claimed fails first, the server skips
// the rest up to Sync and rolls the implicit transaction back: the replay
// costs this one round trip and leaves the connection idle.
func onConn[T any](ctx context.Context, conn *pgx.Conn, c *call, fn func(pgx.Tx) (T, error)) (T, error) {
	var zero T
	if conn.PgConn().TxStatus() != 'I' {
		return zero, errors.New("idem: the connection is inside a transaction; pass that pgx.Tx to Do instead")
	}
	// A non-default isolation level must be set before the first snapshot,
	// so BEGIN goes first and a replay pays a ROLLBACK round trip.
	claimFirst := c.begin == "begin"
	if claimFirst {
		if err := prepareFirstTrip(ctx, conn, c.stmts); err != nil {
			rollbackConn(ctx, conn)
			return zero, fmt.Errorf("idem: prepare: %w", err)
		}
	}
	b := batch(&c.first, c.firstQ[:])
	if claimFirst {
		b.Queue(c.stmts.claim, c.claimArgs()...)
		b.Queue(c.stmts.assertClaimed, c.scopeArg, c.keyArg)
		b.Queue("begin")
	} else {
		b.Queue(c.begin)
		b.Queue(c.stmts.claim, c.claimArgs()...)
	}
	b.Queue("savepoint idem_work")

	br := conn.SendBatch(ctx, b)
	var beginErr error
	if !claimFirst {
		_, beginErr = br.Exec()
	}
	cl, claimErr := c.scanClaim(br.QueryRow())
	closeErr := br.Close()
	if beginErr != nil || claimErr != nil || !cl.claimed || closeErr != nil {
		rollbackConn(ctx, conn)
	}
	switch {
	case beginErr != nil:
		return zero, fmt.Errorf("idem: begin: %w", beginErr)
	case claimErr != nil:
		return zero, fmt.Errorf("idem: claim key: %w", claimErr)
	case !cl.claimed:
		return settle[T](ctx, conn, c, cl)
	case closeErr != nil:
		return zero, fmt.Errorf("idem: begin: %w", closeErr)
	}

	tx := &connTx{conn: conn}
	finished := false
	defer func() {
		tx.closed = true
		if !finished { // fn panicked: roll back, and let the panic go on.
			rollbackConn(ctx, conn)
		}
	}()
	v, fnErr := fn(tx)
	tx.closed = true

	fin, err := finishing(ctx, c, v, fnErr)
	if err != nil {
		finished = true
		rollbackConn(ctx, conn)
		return v, err
	}
	fb := batch(&c.last, c.lastQ[:])
	if fin.refused {
		fb.Queue("rollback to savepoint idem_work")
	}
	fb.Queue(c.stmts.complete, c.scopeArg, c.keyArg, fin.status, fin.response, fin.refusal)
	fb.Queue("commit")
	fr := conn.SendBatch(ctx, fb)
	err = execAll(fr, fb.Len())
	finished = true
	if err != nil {
		rollbackConn(ctx, conn)
		return v, commitError(err, true)
	}
	return v, fnErr
}

// execAll reads n results and reports the first failure, including a COMMIT
// that the server turned into a rollback.
func execAll(br pgx.BatchResults, n int) error {
	var first error
	for i := 0; i < n; i++ {
		tag, err := br.Exec()
		if err != nil && first == nil {
			first = err
		}
		if err == nil && i == n-1 && tag.String() == "ROLLBACK" && first == nil {
			first = pgx.ErrTxCommitRollback
		}
	}
	if err := br.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

// commitError classifies a failure of the round trip that carries COMMIT.
// A server error or a request that never left means nothing committed; any
// other failure after sending leaves the outcome unknown.
func commitError(err error, ownsCommit bool) error {
	var pgErr *pgconn.PgError
	if !ownsCommit || errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("idem: commit: %w", err)
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}

// finish is the outcome to store, prepared before the last round trip.
type finish struct {
	status   string
	response []byte
	// refusal is the jsonb parameter: a string, or nil for NULL. A []byte
	// would travel as bytea in the exec and simple-protocol modes (the
	// modes for PgBouncer), and the server would reject it as JSON.
	refusal any
	refused bool
}

// finishing decides what fn's return means. A nil finish error means store
// it; an error means roll back and return that error.
func finishing[T any](ctx context.Context, c *call, v T, fnErr error) (finish, error) {
	var fin finish
	if fnErr != nil {
		var refusal *Refusal
		if !errors.As(fnErr, &refusal) || refusal == nil {
			return fin, fnErr
		}
		if refusal.Code == "" {
			return fin, fmt.Errorf("idem: a Refusal needs a Code: %w", fnErr)
		}
		raw, err := refusal.marshal()
		if err != nil {
			return fin, fmt.Errorf("idem: encode refusal: %w", err)
		}
		fin.refusal, fin.refused, fin.status = string(raw), true, "refused"
	} else {
		fin.status = "completed"
	}
	resp, err := encode(v)
	if err != nil {
		return fin, fmt.Errorf("idem: encode result: %w", err)
	}
	if c.cfg.sealer != nil {
		if resp, err = c.cfg.sealer.Seal(ctx, c.cfg.scope, c.key, resp); err != nil {
			return fin, fmt.Errorf("idem: seal result: %w", err)
		}
	}
	if resp == nil {
		resp = []byte{} // NULL is reserved for rows that hold no result yet
	}
	fin.response = resp
	return fin, nil
}

// settle answers a call that did not claim its key: a replay, a mismatch, or
// a key in progress.
func settle[T any](ctx context.Context, q querier, c *call, cl claim) (T, error) {
	var zero T
	if cl.rec == nil && cl.locked != nil && *cl.locked {
		// We held the lock yet could not claim: the row committed after our
		// snapshot was taken. A new statement sees it.
		rec, err := lookup(ctx, q, c)
		if err != nil {
			return zero, err
		}
		cl.rec = rec
	}
	if cl.rec == nil {
		return zero, ErrInProgress
	}
	return replay[T](ctx, c, cl.rec)
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func lookup(ctx context.Context, q querier, c *call) (*record, error) {
	var rec record
	err := q.QueryRow(ctx, c.stmts.lookup, c.cfg.scope, c.key).
		Scan(&rec.requestHash, &rec.status, &rec.response, &rec.refusal)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idem: look up key: %w", err)
	}
	return &rec, nil
}

func replay[T any](ctx context.Context, c *call, rec *record) (T, error) {
	var zero T
	if rec.requestHash != c.reqHash {
		return zero, ErrMismatch
	}
	data := rec.response
	if c.cfg.sealer != nil {
		opened, err := c.cfg.sealer.Open(ctx, c.cfg.scope, c.key, data)
		if err != nil {
			return zero, fmt.Errorf("%w: open: %w", ErrCorruptRecord, err)
		}
		data = opened
	}
	v, err := decode[T](data)
	if err != nil {
		return zero, fmt.Errorf("%w: %w", ErrCorruptRecord, err)
	}
	if c.cfg.replayed != nil {
		*c.cfg.replayed = true
	}
	if rec.status == "refused" {
		refusal := new(Refusal)
		if err := json.Unmarshal(rec.refusal, refusal); err != nil {
			return zero, fmt.Errorf("%w: refusal: %w", ErrCorruptRecord, err)
		}
		return v, refusal
	}
	return v, nil
}

// rollbackConn ends whatever transaction conn is in. It uses ctx's values but
// not its cancellation: the caller's ctx may be why we roll back. A
// connection that cannot roll back is closed, which rolls back server-side.
func rollbackConn(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || (conn.PgConn().TxStatus() == 'I' && !conn.PgConn().IsBusy()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, "rollback"); err != nil {
		_ = conn.Close(ctx)
	}
}

// rollbackTimeout bounds the cleanup of a failed attempt.
const rollbackTimeout = 5 * time.Second

func beginSQL(o pgx.TxOptions) string {
	s := "begin"
	if o.IsoLevel != "" {
		s += " isolation level " + string(o.IsoLevel)
	}
	if o.DeferrableMode != "" {
		s += " " + string(o.DeferrableMode)
	}
	return s
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
