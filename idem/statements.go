package idem

import (
	"context"
	_ "embed"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/sqltext"
)

var (
	//go:embed sql/claim.sql
	claimSQL string
	//go:embed sql/assert_claimed.sql
	assertClaimedSQL string
	//go:embed sql/complete.sql
	completeSQL string
	//go:embed sql/lookup.sql
	lookupSQL string
	//go:embed sql/sweep.sql
	sweepSQL string
	//go:embed sql/record.sql
	recordSQL string
	//go:embed sql/forget.sql
	forgetSQL string
)

// statements is the SQL of one table, rewritten once and reused: pgx caches
// prepared statements by SQL text, so the text must not change per call.
type statements struct {
	table                                  string
	claim, assertClaimed, complete, lookup string
	sweep, record, forget                  string
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
		return nil, err
	}
	s := &statements{
		table:         table,
		claim:         t.Rewrite(claimSQL),
		assertClaimed: t.Rewrite(assertClaimedSQL),
		complete:      t.Rewrite(completeSQL),
		lookup:        t.Rewrite(lookupSQL),
		sweep:         t.Rewrite(sweepSQL),
		record:        t.Rewrite(recordSQL),
		forget:        t.Rewrite(forgetSQL),
	}
	actual, _ := statementCache.LoadOrStore(table, s)
	return actual.(*statements), nil
}

// setIdleTimeoutSQL sets Config.IdleTimeout ($1, in milliseconds) for the
// rest of the current transaction only (is_local), like SET LOCAL but with a
// parameter, so that one statement serves every value.
const setIdleTimeoutSQL = "select set_config('idle_in_transaction_session_timeout', $1, true)"

// preparedKey names the entry of a connection's CustomData that records the
// statement sets already prepared by name on that connection.
const preparedKey = "idem.prepared"

// prepareFirstTrip prepares, once per connection, the statements of the
// first round trip under their own names. pgx forgets every cached statement
// of a batch that fails, and a replay's batch fails on purpose
// (assert_claimed): with only the cache, every replay, and the next call on
// that connection, would pay extra round trips to deallocate and prepare them
// again. Named statements survive a failed batch. Connections in another
// exec mode (the simple protocol, or describe-only caching behind PgBouncer)
// are left as they are.
func prepareFirstTrip(ctx context.Context, conn *pgx.Conn, s *statements) error {
	data := conn.PgConn().CustomData()
	done, _ := data[preparedKey].(map[*statements]bool)
	if done[s] {
		return nil
	}
	if conn.Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		for _, sql := range [...]string{s.claim, s.assertClaimed, "begin", setIdleTimeoutSQL, "savepoint idem_work"} {
			if _, err := conn.Prepare(ctx, sql, sql); err != nil {
				return err
			}
		}
	}
	if done == nil {
		done = make(map[*statements]bool, 1)
		data[preparedKey] = done
	}
	done[s] = true
	return nil
}
