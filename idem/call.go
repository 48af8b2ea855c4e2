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

	// proto is the attempt's protocol (chooseProtocol), and what its claim
	// told its completion: replace, that deferredProtocol's write replaces a
	// row that is not live; createdAt, the row partitionedProtocol claimed
	// on a table where the key may have older rows.
	proto     protocol
	replace   bool
	createdAt time.Time

	// What every attempt sends and scans lives here, allocated once with the
	// call: the arguments boxed once (scope and key go out three times), the
	// two pipelines with room for their statements, and the claim's targets.
	scopeArg, keyArg any
	lockArg          any // lockKey(scope, key)
	claimArgv        [5]any
	scan             claimTargets
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
	c.lockArg = lockKey(scope, key)
	c.claimArgv = [5]any{c.scopeArg, c.keyArg, reqHash, c.ttlMicro, c.lockArg}
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
