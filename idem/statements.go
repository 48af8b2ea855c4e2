package idem

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/sqltext"
)

var (
	// The protocols' statements (protocol_*.go).
	//go:embed sql/claim.sql
	claimSQL string
	//go:embed sql/assert_claimed.sql
	assertClaimedSQL string
	//go:embed sql/complete.sql
	completeSQL string
	//go:embed sql/claim_partitioned.sql
	claimPartitionedSQL string
	//go:embed sql/assert_claimed_partitioned.sql
	assertClaimedPartitionedSQL string
	//go:embed sql/complete_partitioned.sql
	completePartitionedSQL string
	//go:embed sql/claim_citus.sql
	claimCitusSQL string
	//go:embed sql/insert_citus.sql
	insertCitusSQL string
	//go:embed sql/complete_citus.sql
	completeCitusSQL string

	//go:embed sql/lookup.sql
	lookupSQL string
	//go:embed sql/sweep.sql
	sweepSQL string
	//go:embed sql/record.sql
	recordSQL string
	//go:embed sql/forget.sql
	forgetSQL string
	//go:embed sql/layout.sql
	layoutSQL string
	//go:embed sql/sweep_citus.sql
	sweepCitusSQL string
	//go:embed sql/record_citus.sql
	recordCitusSQL string

	//go:embed sql/record_partitioned.sql
	recordPartitionedSQL string
	//go:embed sql/partitions.sql
	partitionsSQL string
	//go:embed sql/partman.sql
	partmanSQL string
	//go:embed sql/plain_only.sql
	plainOnlySQL string

	//go:embed sql/operation_peek.sql
	opPeekSQL string
	//go:embed sql/operation_lock.sql
	opLockSQL string
	//go:embed sql/operation_begin.sql
	opBeginSQL string
	//go:embed sql/operation_take.sql
	opTakeSQL string
	//go:embed sql/operation_fence.sql
	opFenceSQL string
	//go:embed sql/operation_call.sql
	opCallSQL string
	//go:embed sql/operation_record.sql
	opRecordSQL string
	//go:embed sql/operation_pending.sql
	opPendingSQL string
	//go:embed sql/operation_steps.sql
	opStepsSQL string
	//go:embed sql/operation_renew.sql
	opRenewSQL string
	//go:embed sql/operation_release.sql
	opReleaseSQL string
	//go:embed sql/operation_complete.sql
	opCompleteSQL string
	//go:embed sql/operation_stats.sql
	opStatsSQL string
	//go:embed sql/operation_layout.sql
	opLayoutSQL string

	//go:embed sql/operation_token_citus.sql
	opTokenCitusSQL string
	//go:embed sql/operation_begin_citus.sql
	opBeginCitusSQL string
	//go:embed sql/operation_take_citus.sql
	opTakeCitusSQL string
	//go:embed sql/operation_fence_citus.sql
	opFenceCitusSQL string
	//go:embed sql/operation_call_citus.sql
	opCallCitusSQL string
	//go:embed sql/operation_record_citus.sql
	opRecordCitusSQL string
	//go:embed sql/operation_renew_citus.sql
	opRenewCitusSQL string
	//go:embed sql/operation_complete_citus.sql
	opCompleteCitusSQL string
)

// opSQL is the statements of operations made of steps (operation.go), in
// the order a run sends them.
type opSQL struct {
	peek, lock, begin, take, steps, fence, call, record, pending, renew, release, complete string
	stats, layout                                                                          string

	// token is set on a Citus cluster only (newOpCitusSQL), and marks the
	// shape its statements share (onCitus): the owning transaction draws
	// the new token with this statement and passes it to begin and take
	// (their last argument); the fence leaves the idle timeout to
	// setIdleTimeoutSQL; record takes the run as its last argument; begin
	// and record fail with 22012 where the plain ones return no row; and
	// renew renews one lease per statement, the renewer sending one per
	// owner in one pipeline.
	token string
}

// onCitus reports the statements of a Citus cluster (newOpCitusSQL).
func (op *opSQL) onCitus() bool { return op.token != "" }

// recordArgs returns the arguments of record.
func (op *opSQL) recordArgs(scope, key string, token int64, step string, data []byte, micros int64, run string) []any {
	args := []any{scope, key, token, step, data, micros}
	if op.onCitus() {
		args = append(args, run)
	}
	return args
}

// noRow turns the failure by which a statement of Citus's set says what
// the plain one says with no row (begin, record) into pgx.ErrNoRows.
func (op *opSQL) noRow(err error) error {
	if op.onCitus() && isDivisionByZero(err) {
		return pgx.ErrNoRows
	}
	return err
}

func newOpSQL(t sqltext.Table) opSQL {
	return opSQL{
		peek: t.Rewrite(opPeekSQL), lock: t.Rewrite(opLockSQL), begin: t.Rewrite(opBeginSQL),
		take: t.Rewrite(opTakeSQL), fence: t.Rewrite(opFenceSQL), call: t.Rewrite(opCallSQL), record: t.Rewrite(opRecordSQL), pending: opPendingSQL,
		steps: t.Rewrite(opStepsSQL), renew: t.Rewrite(opRenewSQL), release: t.Rewrite(opReleaseSQL),
		complete: t.Rewrite(opCompleteSQL), stats: t.Rewrite(opStatsSQL), layout: t.Rewrite(opLayoutSQL),
	}
}

// newOpCitusSQL is newOpSQL on a Citus cluster (schema.ApplyDistributed):
// every statement names the key's shard (scope = $1), so that Citus routes
// it whole to the node holding it, and an operation's transactions are
// single-shard ones through any node. Those that write avoid what Citus
// refuses on distributed tables: volatile functions (nextval,
// clock_timestamp, set_config) in an UPDATE, non-IMMUTABLE ones in ON
// CONFLICT and RETURNING, and FOR UPDATE over several shards.
func newOpCitusSQL(t sqltext.Table) opSQL {
	op := newOpSQL(t)
	op.token = t.Rewrite(opTokenCitusSQL)
	op.begin, op.take = t.Rewrite(opBeginCitusSQL), t.Rewrite(opTakeCitusSQL)
	op.fence, op.call, op.record = t.Rewrite(opFenceCitusSQL), t.Rewrite(opCallCitusSQL), t.Rewrite(opRecordCitusSQL)
	op.renew, op.complete = t.Rewrite(opRenewCitusSQL), t.Rewrite(opCompleteCitusSQL)
	return op
}

// statements is the SQL of one table, rewritten once and reused: pgx caches
// prepared statements by SQL text, so the text must not change per call.
//
// Each table has two sets: one for the plain layout (schema/*.sql) and one
// for the partitioned layout (schema/partitioned), reached through
// partitioned. Which one a call uses is learnt once per connection
// (connState), since one table name may be plain in one database and
// partitioned in another. The protocols' own statements live with each
// protocol (protocol_*.go).
type statements struct {
	table                         string
	lookup, sweep, record, forget string
	checkOperations, checkCitus   string

	// The protocols' statements: insert and deferred on the plain set,
	// part on the partitioned one, citus on Citus's (chooseProtocol).
	insert   protocolSQL
	deferred deferredSQL
	part     protocolSQL
	citus    protocolSQL
	// op is the statements of operations (the plain layout, distributed
	// or not).
	op opSQL

	// isPartitioned marks the set of the partitioned layout, isCitus the
	// set of a database with the Citus extension.
	isPartitioned, isCitus bool
	// partitioned and distributed are the partitioned layout's set and
	// Citus's, on the plain set; nil on those sets themselves.
	partitioned, distributed *statements
}

// statementCache maps a table name to its *statements. It only ever grows
// by the handful of tables an application uses.
var statementCache sync.Map

func statementsFor(table string) (*statements, error) {
	if s, ok := statementCache.Load(table); ok {
		return s.(*statements), nil
	}
	t, err := sqltext.ParseTable(table)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidTable, err)
	}
	s := &statements{
		table:           table,
		lookup:          t.Rewrite(lookupSQL),
		sweep:           t.Rewrite(sweepSQL),
		record:          t.Rewrite(recordSQL),
		forget:          t.Rewrite(forgetSQL),
		checkOperations: t.Rewrite(checkOperationsSQL),
		checkCitus:      t.Rewrite(checkCitusSQL),
		insert:          newProtocolSQL(t, claimSQL, assertClaimedSQL, completeSQL),
		deferred:        newDeferredSQL(t),
		op:              newOpSQL(t),
	}
	s.partitioned = &statements{
		table:           table,
		lookup:          s.lookup,
		record:          t.Rewrite(recordPartitionedSQL),
		forget:          s.forget,
		checkOperations: s.checkOperations,
		part:            newProtocolSQL(t, claimPartitionedSQL, assertClaimedPartitionedSQL, completePartitionedSQL),
		op:              s.op,
		isPartitioned:   true,
	}
	s.distributed = &statements{
		table:           table,
		lookup:          s.lookup,
		sweep:           t.Rewrite(sweepCitusSQL),
		record:          t.Rewrite(recordCitusSQL),
		forget:          s.forget,
		checkOperations: s.checkOperations,
		citus:           newProtocolSQL(t, claimCitusSQL, insertCitusSQL, completeCitusSQL),
		op:              newOpCitusSQL(t),
		isCitus:         true,
	}
	actual, _ := statementCache.LoadOrStore(table, s)
	return actual.(*statements), nil
}

// connStateKey names the entry of a connection's CustomData that holds
// idem's per-connection state.
const connStateKey = "idem.conn"

// connState is what idem remembers about one connection: the statement set
// each table resolved to (its layout) and the sets already prepared by
// name.
type connState struct {
	layout   map[*statements]*statements
	prepared map[protocol]bool
	// execMode is the connection's default exec mode, 0 until asked.
	execMode pgx.QueryExecMode
	// preparedSQL holds the other statements of first trips prepared by
	// name: the SET statements of WithTxOptions.
	preparedSQL map[string]bool
	// defaultIso is the session's default isolation level, learnt with the
	// layout: it chooses the protocol of a call without WithTxOptions. ""
	// until asked, and again after assert_deferred.sql found it changed.
	defaultIso pgx.TxIsoLevel
}

func stateOf(conn *pgx.Conn) *connState {
	data := conn.PgConn().CustomData()
	st, _ := data[connStateKey].(*connState)
	if st == nil {
		st = &connState{
			layout:      make(map[*statements]*statements, 1),
			prepared:    make(map[protocol]bool, 1),
			preparedSQL: make(map[string]bool),
		}
		data[connStateKey] = st
	}
	return st
}

// resolveLayout returns the statement set for s's table as this connection sees
// it: s itself for a plain table, s.partitioned for a partitioned one. The
// first call per connection and table asks the catalog (one round trip);
// the answer is kept for the connection's life. A table that does not exist
// yet is not remembered: the claim will say it is missing.
//
// A table migrated from one layout to the other while connections are open
// keeps its old statements on them, which then fail (the plain claim's ON
// CONFLICT finds no matching unique index on a partitioned table): reset the
// pool after such a migration.
func resolveLayout(ctx context.Context, conn *pgx.Conn, s *statements) (*statements, pgx.TxIsoLevel, error) {
	st := stateOf(conn)
	if r, ok := st.layout[s]; ok && st.defaultIso != "" {
		return r, st.defaultIso, nil
	}
	r, iso, known, err := detectLayout(ctx, conn, s)
	if err != nil {
		return nil, "", fmt.Errorf("idem: detect the layout of %s: %w", s.table, err)
	}
	if known {
		st.layout[s], st.defaultIso = r, iso
	}
	return r, iso, nil
}

// detectLayout asks the catalog whether s's table is partitioned, and the
// session's default isolation level, through any querier; known is false
// when the table does not exist.
func detectLayout(ctx context.Context, q querier, s *statements) (r *statements, iso pgx.TxIsoLevel, known bool, err error) {
	var (
		partitioned, citus bool
		level              string
	)
	err = q.QueryRow(ctx, layoutSQL, s.table).Scan(&partitioned, &level, &citus)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return s, "", false, nil
	case err != nil:
		return nil, "", false, err
	}
	iso = isoLevel(level)
	if citus && partitioned {
		return nil, "", false, fmt.Errorf("%w: the partitioned layout of %s is not supported on Citus: a live key is unique there only by its lock and a second look, and Citus refuses the statements that keep it (docs/SCALING.md); distribute the plain layout (schema.ApplyDistributed)", ErrInvalidTable, s.table)
	}
	if citus {
		return s.distributed, iso, true, nil
	}
	if partitioned {
		return s.partitioned, iso, true, nil
	}
	return s, iso, true, nil
}

// isoLevel turns a setting's value ("read committed") into pgx's constant.
func isoLevel(setting string) pgx.TxIsoLevel {
	switch setting {
	case "serializable":
		return pgx.Serializable
	case "repeatable read":
		return pgx.RepeatableRead
	case "read uncommitted":
		return pgx.ReadUncommitted
	}
	return pgx.ReadCommitted
}

// resolveQuerier is resolveLayout for whatever q is: a connection or transaction
// uses the per-connection memory, anything else (a pool) asks each time.
func resolveQuerier(ctx context.Context, q querier, s *statements) (*statements, error) {
	if conn := connOf(q); conn != nil {
		r, _, err := resolveLayout(ctx, conn, s)
		return r, err
	}
	r, _, _, err := detectLayout(ctx, q, s)
	if err != nil {
		return nil, fmt.Errorf("idem: detect the layout of %s: %w", s.table, err)
	}
	return r, nil
}

// connOf returns the connection behind q, if it has exactly one.
func connOf(q any) *pgx.Conn {
	switch d := q.(type) {
	case *pgx.Conn:
		return d
	case *pgxpool.Conn:
		return d.Conn()
	case pgx.Tx:
		return d.Conn() // nil for a transaction without a pgx connection
	}
	return nil
}

// setIdleTimeoutSQL sets Config.IdleTimeout ($1, in milliseconds) for the
// rest of the current transaction only (is_local), like SET LOCAL but with a
// parameter, so that one statement serves every value.
const setIdleTimeoutSQL = "select set_config('idle_in_transaction_session_timeout', $1, true)"

// prepareFirstTrip prepares, once per connection, the statements of the
// first round trip under their own names: s's claims and assertions, BEGIN,
// the idle timeout, the savepoint, and the SET statements of setTx. pgx
// forgets every cached statement of a batch that fails, and a replay's batch
// fails on purpose (the assertion): with only the cache, every replay, and
// the next call on that connection, would pay extra round trips to
// deallocate and prepare them again. Named statements survive a failed
// batch. Connections in another exec mode (the simple protocol, or
// describe-only caching behind PgBouncer) are left as they are.
func prepareFirstTrip(ctx context.Context, conn *pgx.Conn, p protocol, setTx []string) error {
	st := stateOf(conn)
	if st.execMode == 0 {
		// Conn.Config copies the whole configuration: ask once.
		st.execMode = conn.Config().DefaultQueryExecMode
	}
	if st.execMode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	if !st.prepared[p] {
		for _, sql := range append(p.firstTrip(), "begin", "savepoint idem_work") {
			if _, err := conn.Prepare(ctx, sql, sql); err != nil {
				return err
			}
		}
		st.prepared[p] = true
	}
	for _, sql := range setTx {
		if st.preparedSQL[sql] {
			continue
		}
		if _, err := conn.Prepare(ctx, sql, sql); err != nil {
			return err
		}
		st.preparedSQL[sql] = true
	}
	return nil
}

// protocolSQL is one protocol's statements for one table (protocol_*.go):
// the claim, the statement that follows it in the claim's round trip (the
// assertion that the claim inserted the row; on Citus, the insertion) and
// the completion.
type protocolSQL struct{ claim, next, complete string }

func newProtocolSQL(t sqltext.Table, claim, next, complete string) protocolSQL {
	return protocolSQL{claim: t.Rewrite(claim), next: t.Rewrite(next), complete: t.Rewrite(complete)}
}
