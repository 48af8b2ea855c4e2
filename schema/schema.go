// Package schema holds idem's table definition and applies it.
//
// The files schema/[0-9]*.sql, applied in order, yield the complete schema;
// each is plain SQL that psql -f applies and that is safe to apply again.
// Apply and ApplyTable run the same files from Go, for applications without
// a migration tool.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/idemhq/idem/internal/dbtx"
	"github.com/idemhq/idem/internal/sqltext"
)

//go:embed [0-9]*.sql
var files embed.FS

// Execer runs a statement: *pgxpool.Pool, *pgx.Conn and pgx.Tx all do. It
// is the same interface as idem.Execer.
type Execer = dbtx.Execer

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
// idem.ErrInvalidTable and nothing is executed.
func ApplyTable(ctx context.Context, db Execer, table string) error {
	t, err := sqltext.ParseTable(table)
	if err != nil {
		return err
	}
	scripts, err := Files()
	if err != nil {
		return err
	}
	var b strings.Builder
	// One multi-statement string runs as one implicit transaction: either
	// every file applies or none does. The lock keeps concurrent starts from
	// racing on CREATE TABLE IF NOT EXISTS, which is not concurrency-safe.
	b.WriteString("SELECT pg_advisory_xact_lock(7306086, hashtext('idem schema'));\n")
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
func Files() ([]File, error) {
	names, err := fs.Glob(files, "[0-9]*.sql")
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
		out = append(out, File{Name: n, SQL: string(b)})
	}
	return out, nil
}
