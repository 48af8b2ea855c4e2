// Package schema holds idem's table definition and applies it.
//
// The files schema/[0-9]*.sql, applied in order, yield the complete schema;
// each is plain SQL that psql -f applies and that is safe to apply again.
// Apply and ApplyTable run the same files from Go, for applications without
// a migration tool.
//
// The files schema/partitioned/[0-9]*.sql are the opt-in partitioned layout
// of the same table, which sheds expired keys by dropping whole partitions
// instead of deleting rows; ApplyPartitioned runs them from Go.
//
// The files schema/distributed/[0-9]*.sql, applied after the plain ones,
// distribute the tables over a Citus cluster, colocated with a business
// table; ApplyDistributed runs them all from Go.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/sentinel"
	"github.com/idemhq/idem/internal/sqltext"
)

//go:embed [0-9]*.sql partitioned/[0-9]*.sql distributed/[0-9]*.sql
var files embed.FS

// DefaultPartitionInterval is the partition interval documented for
// production: one partition per day, for keys kept about a day.
const DefaultPartitionInterval = 24 * time.Hour

// Execer runs a statement: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and
// pgx.Tx all do.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Apply creates or completes the idempotency_keys table. It is safe to call
// on every start and from several processes at once: concurrent callers
// serialize on a transaction-scoped advisory lock when db is a pool or a
// connection.
func Apply(ctx context.Context, db Execer) error {
	return ApplyTable(ctx, db, sqltext.DefaultTable)
}

// ApplyTable is Apply for a table of another name, optionally
// schema-qualified ("billing.idempotency_keys"; the schema must exist). The
// name must be a plain lower-case identifier; otherwise the error wraps
// sentinel.ErrInvalidTable and nothing is executed.
func ApplyTable(ctx context.Context, db Execer, table string) error {
	t, err := sqltext.ParseTable(table)
	if err != nil {
		return fmt.Errorf("%w: %w", sentinel.ErrInvalidTable, err)
	}
	scripts, err := Files()
	if err != nil {
		return err
	}
	return apply(ctx, db, t, table, scripts, "")
}

// ApplyPartitioned creates or completes the partitioned layout of the key
// table (schema/partitioned): the same columns, partitioned by RANGE on
// created_at into partitions of interval each, a DEFAULT partition that
// takes any row no other partition takes (a claim never fails for want of a
// partition), and the partitions of the present and the three intervals
// after it. idem.Do and everything built on it work on either layout;
// Client.Sweep keeps partitions made ahead and drops those whose keys have all
// expired. table is as for ApplyTable ("" means idempotency_keys).
//
// interval must be a whole number of seconds, at least one (an error
// wrapping sentinel.ErrInvalidOption otherwise); DefaultPartitionInterval, a
// day, suits production, while tests use a second or two to cross partition
// boundaries quickly. Keep it near the key TTL: every lookup of a key probes
// each partition's primary key, so fewer partitions are cheaper.
//
// Applying it again is safe. On an existing partitioned table it only adds
// what is missing, and an interval unlike the existing partitions' applies
// to the partitions made after them. A table of that name that is not
// partitioned is an error: a plain table cannot be turned into this layout
// in place. Making a partition takes an ACCESS EXCLUSIVE lock on the table
// for a moment, so on a busy table it may wait for running transactions.
func ApplyPartitioned(ctx context.Context, db Execer, table string, interval time.Duration) error {
	if table == "" {
		table = sqltext.DefaultTable
	}
	t, err := sqltext.ParseTable(table)
	if err != nil {
		return fmt.Errorf("%w: %w", sentinel.ErrInvalidTable, err)
	}
	if interval < time.Second || interval%time.Second != 0 {
		return fmt.Errorf("%w: partition interval %v: want a whole number of seconds, at least one", sentinel.ErrInvalidOption, interval)
	}
	scripts, err := PartitionedFiles()
	if err != nil {
		return err
	}
	// The interval travels in a transaction-local setting that
	// 002_idempotency_keys_partitions.sql reads, so that psql applies the
	// same file unchanged.
	set := fmt.Sprintf("SELECT set_config('idem.partition_interval', '%d seconds', true);\n", interval/time.Second)
	return apply(ctx, db, t, table, scripts, set)
}

// ApplyDistributed applies the plain layout (as ApplyTable) and distributes
// its tables over a Citus cluster (schema/distributed): the key table and
// the tables of unfinished operations, by scope, colocated with
// colocateWith, a table already hash-distributed by the column that holds
// the tenant (of type text). A call whose scope is that tenant
// (idem.ContextWithScope) and whose fn writes only that tenant's rows is
// then a single-shard transaction on the node that holds the tenant's
// shards; docs/SCALING.md says what holds on Citus. colocateWith "" leaves
// the tables colocated with nothing. table is as for ApplyTable ("" means
// idempotency_keys).
//
// Run it on the coordinator. Applying it again is safe: a table already
// distributed is left as it is, and Client.Check reports one that is not
// colocated with colocateWith.
func ApplyDistributed(ctx context.Context, db Execer, table, colocateWith string) error {
	if table == "" {
		table = sqltext.DefaultTable
	}
	t, err := sqltext.ParseTable(table)
	if err != nil {
		return fmt.Errorf("%w: %w", sentinel.ErrInvalidTable, err)
	}
	if colocateWith != "" {
		if _, err := sqltext.ParseTable(colocateWith); err != nil {
			return fmt.Errorf("%w: colocate with: %w", sentinel.ErrInvalidTable, err)
		}
	}
	scripts, err := Files()
	if err != nil {
		return err
	}
	dist, err := glob("distributed/[0-9]*.sql")
	if err != nil {
		return err
	}
	// The table to colocate with travels in a transaction-local setting
	// that the file reads, so that psql applies the same file unchanged.
	set := fmt.Sprintf("SELECT set_config('idem.colocate_with', '%s', true);\n", colocateWith)
	if err := apply(ctx, db, t, table, scripts, ""); err != nil {
		return err
	}
	return apply(ctx, db, t, table, dist, set)
}

func apply(ctx context.Context, db Execer, t sqltext.Table, table string, scripts []File, prelude string) error {
	if v := reflect.ValueOf(db); db == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return fmt.Errorf("%w: schema: nil database (a nil %T)", sentinel.ErrInvalidOption, db)
	}
	var b strings.Builder
	// One multi-statement string runs as one implicit transaction: either
	// every file applies or none does. The lock keeps concurrent starts from
	// racing on CREATE TABLE IF NOT EXISTS, which is not concurrency-safe.
	b.WriteString("SELECT pg_advisory_xact_lock(7306086, hashtext('idem schema'));\n")
	b.WriteString(prelude)
	for _, s := range scripts {
		b.WriteString(t.Rewrite(s.SQL))
		b.WriteString(";\n")
	}
	if _, err := db.Exec(ctx, b.String()); err != nil {
		return fmt.Errorf("idem: apply schema to %s: %w", table, err)
	}
	return nil
}

// A File is one schema file.
type File struct {
	Name string // e.g. "001_idempotency_keys.sql"
	SQL  string
}

// Files returns the schema files in the order they apply, without the
// *.down.sql ones.
func Files() ([]File, error) { return glob("[0-9]*.sql") }

// PartitionedFiles returns the files of the partitioned layout
// (schema/partitioned) in the order they apply; Name is relative to that
// folder.
func PartitionedFiles() ([]File, error) {
	files, err := glob("partitioned/[0-9]*.sql")
	if err != nil {
		return nil, err
	}
	// The tables of unfinished operations are the same for both layouts
	// (Forget and Stats read them); idem.Operation itself runs on the plain
	// layout only.
	ops, err := glob(operationsFile)
	if err != nil {
		return nil, err
	}
	return append(files, ops...), nil
}

// operationsFile is the schema of unfinished operations, shared by both
// layouts.
const operationsFile = "002_idempotency_keys_operations.sql"

// PartitionsSQL is schema/partitioned/002_idempotency_keys_partitions.sql
// for table: the maintenance step that makes the DEFAULT partition and the
// partitions of the present and the near future, taking the interval from
// the newest partition. Client.Sweep runs it.
func PartitionsSQL(table string) (string, error) {
	t, err := sqltext.ParseTable(table)
	if err != nil {
		return "", fmt.Errorf("%w: %w", sentinel.ErrInvalidTable, err)
	}
	b, err := files.ReadFile("partitioned/002_idempotency_keys_partitions.sql")
	if err != nil {
		return "", err
	}
	return t.Rewrite(string(b)), nil
}

func glob(pattern string) ([]File, error) {
	names, err := fs.Glob(files, pattern)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []File
	for _, n := range names {
		if strings.HasSuffix(n, ".down.sql") {
			continue
		}
		b, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		n = strings.TrimPrefix(strings.TrimPrefix(n, "partitioned/"), "distributed/")
		out = append(out, File{Name: n, SQL: string(b)})
	}
	return out, nil
}
