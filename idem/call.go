package idem

import (
	"context"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
)

// isNilPointer reports a typed nil: a nil *pgxpool.Pool or *Client in a
// Beginner is no database either.
func isNilPointer(db Beginner) bool {
	v := reflect.ValueOf(db)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// call is one validated call, free of the result type.
type call struct {
	s        *settings
	stmts    *statements
	scope    string
	key      string
	reqHash  string
	ttlMicro int64
	begin    string
	// setTx are the statements that give the pipeline's implicit
	// transaction WithTxOptions' modes before its first snapshot (see
	// setTxSQL); none without options.
	setTx []string

	// deferred marks an attempt on the deferred protocol (pipeline.go):
	// the key's row is written once, completed, before COMMIT. present says
	// the key has a row that is not live, which that write replaces.
	deferred, present bool

	// What every attempt sends and scans lives here, allocated once with the
	// call: the arguments boxed once (scope and key go out three times), the
	// two pipelines with room for their statements, and the claim's targets.
	scopeArg, keyArg any
	claimArgv        [4]any
	scan             claimTargets
	// createdAt names the row claimed on a partitioned table, whose key may
	// have older rows (claim_partitioned.sql).
	createdAt time.Time
}

func newCall(s *settings, scope, key, reqHash string, db Beginner) (*call, error) {
	if s.err != nil {
		return nil, s.err
	}
	if db == nil || isNilPointer(db) {
		return nil, inputError(ErrInvalidOption, "no database")
	}
	if _, outer := db.(pgx.Tx); outer && s.txOpts != (pgx.TxOptions{}) {
		return nil, inputError(ErrInvalidOption, "WithTxOptions does not apply inside an outer transaction, whose modes are already set")
	}
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if err := validateRequestHash(reqHash); err != nil {
		return nil, err
	}
	c := &call{
		s:        s,
		stmts:    s.stmts,
		scope:    scope,
		key:      key,
		reqHash:  reqHash,
		ttlMicro: s.ttl.Microseconds(),
		begin:    beginSQL(s),
		setTx:    setTxSQL(s),
		scopeArg: scope,
		keyArg:   key,
	}
	c.claimArgv = [4]any{c.scopeArg, c.keyArg, reqHash, c.ttlMicro}
	return c, nil
}

func (c *call) claimArgs() []any { return c.claimArgv[:] }

// callScope is the scope a call stores its key under: the context's (or
// the empty scope), encoded with Wrap's operation if any.
func callScope(ctx context.Context, s *settings) (string, error) {
	scope, _ := ScopeFromContext(ctx)
	if err := ValidateScope(scope); err != nil {
		return "", err
	}
	if s.operation != "" {
		return wrapScope(s.operation, scope)
	}
	return scope, nil
}

func beginSQL(s *settings) string {
	o := s.txOpts
	b := "begin"
	if o.IsoLevel != "" {
		b += " isolation level " + string(o.IsoLevel)
	}
	if o.DeferrableMode != "" {
		b += " " + string(o.DeferrableMode)
	}
	return b
}

// setTxSQL returns the statements that set WithTxOptions' modes in the
// implicit transaction that the extended protocol opens for a pipeline, so
// that the claim can go first and a replay's failing assertion leaves the
// connection idle (pipeline.go): BEGIN first would leave it in an aborted
// transaction block that costs a ROLLBACK round trip. The plain SET of
// these settings acts on the current transaction only, and unlike SET
// TRANSACTION or SET LOCAL it does not warn (in the server's log too) that
// it runs outside a transaction block. They must precede any statement that
// takes a snapshot, which is why they lead the pipeline.
func setTxSQL(s *settings) []string {
	o := s.txOpts
	var out []string
	if o.IsoLevel != "" {
		out = append(out, "set transaction_isolation = '"+string(o.IsoLevel)+"'")
	}
	switch o.DeferrableMode {
	case pgx.Deferrable:
		out = append(out, "set transaction_deferrable = on")
	case pgx.NotDeferrable:
		out = append(out, "set transaction_deferrable = off")
	}
	return out
}

// queueComplete queues the completing statement of the call's layout.
func (c *call) queueComplete(b *pgx.Batch, fin *finish) {
	if c.stmts.isPartitioned {
		b.Queue(c.stmts.complete, c.scopeArg, c.keyArg, fin.status, fin.response, fin.refusal, c.createdAt)
		return
	}
	b.Queue(c.stmts.complete, c.scopeArg, c.keyArg, fin.status, fin.response, fin.refusal)
}

// The status values as arguments, boxed once.
var (
	statusCompletedArg any = statusCompleted
	statusRefusedArg   any = statusRefused
)

func statusArg(status string) any {
	if status == statusRefused {
		return statusRefusedArg
	}
	return statusCompletedArg
}

// queueCompleteDeferred queues the deferred protocol's one write of the key
// row: an insert, or an upsert over a row that is not live.
func (c *call) queueCompleteDeferred(b *pgx.Batch, fin *finish) {
	sql := c.stmts.completeDeferred
	if c.present {
		sql = c.stmts.completeDeferredOn
	}
	// The hash and the TTL are the claim's arguments, boxed once per call.
	b.Queue(sql, c.scopeArg, c.keyArg, c.claimArgv[2], statusArg(fin.status), fin.response, fin.refusal, c.claimArgv[3])
}

// errRepeatableRead refuses a call at REPEATABLE READ on a partitioned
// table: see assert_claimed_partitioned.sql.
func errRepeatableRead(c *call) error {
	return inputError(ErrInvalidOption, "REPEATABLE READ on the partitioned key table %s: its snapshot, taken before the key's lock, cannot see a first attempt that committed in between, and no unique index catches it across partitions; use READ COMMITTED or SERIALIZABLE", c.s.table)
}
