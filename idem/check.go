package idem

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
)

var (
	//go:embed sql/check.sql
	checkSQL string
	//go:embed sql/check_operations.sql
	checkOperationsSQL string
	//go:embed sql/check_citus.sql
	checkCitusSQL string
)

// applySchema is what every error about a missing or malformed key table
// tells the operator to do.
const applySchema = "apply the schema with schema.ApplyTable (or schema.ApplyPartitioned), `idem migrate`, or psql -f each schema/[0-9]*.sql in order (all safe to repeat)"

// Check verifies, in two statements that read the catalog and write
// nothing (three on Citus), that the Client can work with its key table, so that a
// misconfigured deployment fails when it starts rather than at its first
// call. It returns nil, or an error that names every problem found and
// what to do about it:
//
//   - the table exists, as the session's search_path resolves its name;
//   - it has the columns idem reads and writes, with their types, and the
//     unique index on (scope, idempotency_key) that keeps a key's row unique
//     (on the partitioned layout, (scope, idempotency_key, created_at));
//   - a partitioned table is idem's partitioned layout (RANGE on
//     created_at), with a partition, or the DEFAULT one, that takes a key
//     claimed now;
//   - the role may SELECT, INSERT, UPDATE and DELETE its rows;
//   - the tables of unfinished operations exist (schema/002), and the
//     status check of a plain table admits 'unfinished';
//   - the session may write: it is not read-only (default_transaction_read_only,
//     or an outer read-only transaction given to On) and the server is not a
//     standby;
//   - on a database with the Citus extension (a third statement): the key
//     table is distributed by scope if any other table is hash-distributed,
//     the tables of unfinished operations are distributed by scope and
//     colocated with it, and it is colocated with Config.ColocateWith, if
//     set, so that a call's key and the tenant's rows share a shard. A
//     Config.ColocateWith on a database without Citus is reported too.
//
// Check does not verify what only maintenance needs: on the partitioned
// layout, Sweep makes and drops partitions, which needs the table's owner.
// ctx governs the statement. On a Client made with On(tx), Check runs in
// that transaction.
func (c *Client) Check(ctx context.Context) error {
	var (
		name, partKey                           *string
		partitioned, unique, current            bool
		missing                                 []string
		role                                    string
		canSelect, canInsert, canUpdate, canDel bool
		readOnly, standby                       bool
	)
	err := c.query(ctx, func(q querier) error {
		return q.QueryRow(ctx, checkSQL, c.base.table).Scan(&name, &partitioned, &partKey, &missing,
			&unique, &current, &role, &canSelect, &canInsert, &canUpdate, &canDel, &readOnly, &standby)
	})
	if err != nil {
		return fmt.Errorf("idem: check %s: %w", c.base.table, err)
	}
	table := c.base.table
	var problems []error
	add := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	switch {
	case name == nil:
		add("idem: the key table %s does not exist: %s", table, applySchema)
	case len(missing) > 0:
		add("idem: the key table %s lacks columns idem needs, or has them with another type (%s): it is not idem's key table, or was changed; %s, or compare it with schema/001_idempotency_keys.sql",
			table, strings.Join(missing, ", "), applySchema)
	}
	if name != nil {
		layout := "plain"
		if partitioned {
			layout = "partitioned"
		}
		switch {
		case partitioned && (partKey == nil || *partKey != "RANGE (created_at)"):
			add("idem: the key table %s is partitioned by %s; idem's partitioned layout is RANGE (created_at): make it with schema.ApplyPartitioned or `idem migrate -partitioned`", table, deref(partKey))
		case !unique && partitioned:
			add("idem: the key table %s (%s) has no unique index on (scope, idempotency_key, created_at): %s", table, layout, applySchema)
		case !unique:
			add("idem: the key table %s (%s) has no unique index on (scope, idempotency_key), which keeps a key's row unique: %s", table, layout, applySchema)
		}
		if !current {
			add("idem: the key table %s has no partition for keys claimed now, and no DEFAULT partition: every claim would fail; apply the schema with schema.ApplyPartitioned or `idem migrate -partitioned` (safe to repeat), and run a sweeper (Client.SweepEvery or `idem sweep -every`), which makes partitions ahead", table)
		}
		var lacks []string
		for _, p := range []struct {
			name string
			ok   bool
		}{{"SELECT", canSelect}, {"INSERT", canInsert}, {"UPDATE", canUpdate}, {"DELETE", canDel}} {
			if !p.ok {
				lacks = append(lacks, p.name)
			}
		}
		if len(lacks) > 0 {
			add("idem: the role %s may not %s rows of the key table %s: GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s",
				role, strings.Join(lacks, ", "), table, *name, role)
		}
	}
	if name != nil && len(missing) == 0 {
		var opsTable, stepsTable, admits, citus bool
		err := c.query(ctx, func(q querier) error {
			return q.QueryRow(ctx, c.base.stmts.checkOperations, c.base.table).Scan(&opsTable, &stepsTable, &admits, &citus)
		})
		switch {
		case err != nil:
			return fmt.Errorf("idem: check %s: %w", c.base.table, err)
		case !opsTable || !stepsTable:
			add("idem: the tables of unfinished operations (%s_operations, %s_steps) do not exist; Forget and Stats read them: %s", table, table, applySchema)
		case !admits && !partitioned: // operations run on the plain layout only
			add("idem: the key table %s's status check does not admit 'unfinished' (an operation's key): it predates schema/002_idempotency_keys_operations.sql; recreate the check as schema/001_idempotency_keys.sql has it", table)
		}
		switch {
		case citus:
			if err := c.checkCitus(ctx, add); err != nil {
				return fmt.Errorf("idem: check %s: %w", c.base.table, err)
			}
		case c.base.colocateWith != "":
			add("idem: Config.ColocateWith names %s, but the database has no Citus extension: the key table is distributed only on a Citus cluster (docs/SCALING.md); leave ColocateWith empty on plain PostgreSQL", c.base.colocateWith)
		}
	}
	switch {
	case standby:
		add("idem: the server is a standby (in recovery) and cannot store keys: connect to the primary (for example with target_session_attrs=read-write in the connection string)")
	case readOnly:
		add("idem: the session is read-only (transaction_read_only is on: default_transaction_read_only, or a read-only transaction) and cannot store keys: use a read-write session on the primary")
	}
	return errors.Join(problems...)
}

func deref(s *string) string {
	if s == nil {
		return "nothing"
	}
	return *s
}

// checkCitus adds the problems check_citus.sql finds on a database with
// the Citus extension.
func (c *Client) checkCitus(ctx context.Context, add func(string, ...any)) error {
	var (
		column, with         *string
		others, withDist, co bool
		loose                []string
	)
	err := c.query(ctx, func(q querier) error {
		return q.QueryRow(ctx, c.base.stmts.checkCitus, c.base.table, c.base.colocateWith).
			Scan(&column, &others, &loose, &with, &withDist, &co)
	})
	if err != nil {
		return err
	}
	table, want := c.base.table, c.base.colocateWith
	redistribute := fmt.Sprintf("schema.ApplyDistributed(ctx, pool, %q, %q), or psql -f schema/distributed/001_idempotency_keys_distribute.sql with idem.colocate_with set (docs/SCALING.md)", table, want)
	switch {
	case column == nil && (others || want != ""):
		add("idem: the key table %s is not distributed, while the database has distributed tables (Citus): a call's key would live on the coordinator and its work on a worker, one transaction over two nodes; distribute it by scope, colocated with the tenant's tables: %s", table, redistribute)
	case column != nil && *column != "scope":
		add("idem: the key table %s is distributed by %s; idem names a key's shard by scope: recreate it and distribute it by scope (%s)", table, *column, redistribute)
	}
	if column != nil && len(loose) > 0 {
		add("idem: the tables of unfinished operations (%s) are not all distributed by scope in the key table's colocation group: an operation's statements would span nodes; %s", strings.Join(loose, ", "), redistribute)
	}
	switch {
	case want == "":
	case with == nil:
		add("idem: Config.ColocateWith names %s, which does not exist as this session's search_path resolves it", want)
	case !withDist:
		add("idem: Config.ColocateWith names %s, which is not a hash-distributed table: distribute it by the tenant first (create_distributed_table), then the key table with it", *with)
	case column != nil && !co:
		add("idem: the key table %s is not colocated with %s (Config.ColocateWith): a call's key and the tenant's rows live on different shards, and a call that writes them is a transaction over several nodes; move the key tables into its colocation group: SELECT update_distributed_table_colocation(t, colocate_with => '%s') for t in %s and its _operations and _steps tables", table, *with, *with, table)
	}
	return nil
}
