package kit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/internal/sqltext"
)

var (
	//go:embed sql/stored.sql
	storedSQL string
	//go:embed sql/forget.sql
	forgetSQL string
	//go:embed sql/table_info.sql
	tableInfoSQL string
	//go:embed sql/resolve_tables.sql
	resolveTablesSQL string
	//go:embed sql/digest_function.sql
	digestFunctionSQL string
	//go:embed sql/digest.sql
	digestSQL string
)

// A DB is the database a kit checks: where the key table is, and where the
// kit looks for traces of a rolled-back attempt.
type DB struct {
	db     idem.Beginner
	table  string // as the user names it, for messages
	schema string // the key table's schema, quoted as needed
	stored string
	forget string
	skip   []string // regclass names of the tables the digest leaves out
}

// OpenDB checks that db holds the key table and returns the DB. table is
// the key table when db is not an *idem.Client (whose own table is used);
// "" means idem.DefaultTable. ignore names tables the digest leaves out.
func OpenDB(ctx context.Context, db idem.Beginner, table string, ignore []string) (*DB, error) {
	if db == nil {
		return nil, errors.New("DB is nil: give the database the service uses (a *pgxpool.Pool or the *idem.Client)")
	}
	if c, ok := db.(*idem.Client); ok {
		if table != "" && table != c.Table() {
			return nil, fmt.Errorf("Table %q differs from the table of the *idem.Client given as DB (%q): leave Table empty", table, c.Table())
		}
		table = c.Table()
	}
	if table == "" {
		table = idem.DefaultTable
	}
	t, err := sqltext.ParseTable(table)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", idem.ErrInvalidTable, err)
	}
	d := &DB{db: db, table: table, stored: t.Rewrite(storedSQL), forget: t.Rewrite(forgetSQL)}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var name string
		err := tx.QueryRow(ctx, tableInfoSQL, table).Scan(&name, &d.schema)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("the database has no key table %q: give the database the service uses, and its table (Table, or an *idem.Client as DB)", table)
		}
		if err != nil {
			return err
		}
		d.skip = append(d.skip, name)
		// The state of idem's unfinished operations (schema/002) is idem's,
		// as the key table is: left out wherever it exists.
		idemTables := []string{t.Relation("_operations"), t.Relation("_steps")}
		rows, err := tx.Query(ctx, resolveTablesSQL, idemTables)
		if err != nil {
			return err
		}
		for rows.Next() {
			var given string
			var resolved *string
			if err := rows.Scan(&given, &resolved); err != nil {
				return err
			}
			if resolved != nil {
				d.skip = append(d.skip, *resolved)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, resolveTablesSQL, ignore)
		if err != nil {
			return err
		}
		for rows.Next() {
			var given string
			var resolved *string
			if err := rows.Scan(&given, &resolved); err != nil {
				return err
			}
			if resolved == nil {
				return fmt.Errorf("IgnoreTables: the database has no table %q", given)
			}
			d.skip = append(d.skip, *resolved)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Table returns the key table's name as the user gave it.
func (d *DB) Table() string { return d.table }

// Stored reports whether a committed row holds key.
func (d *DB) Stored(ctx context.Context, key string) (bool, error) {
	var stored bool
	err := pgx.BeginFunc(ctx, d.db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, d.stored, key).Scan(&stored)
	})
	return stored, err
}

// Forget deletes the rows of keys.
func (d *DB) Forget(ctx context.Context, keys []string) error {
	return pgx.BeginFunc(ctx, d.db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, d.forget, keys)
		return err
	})
}

// A Digest maps each table's name to a digest of its rows.
type Digest map[string]string

// Digest returns a digest of every table's rows, except the key table, the
// tables OpenDB was told to ignore and the kits' own. It leaves nothing
// behind: its helper function lives in a transaction that rolls back.
func (d *DB) Digest(ctx context.Context) (Digest, error) {
	tx, err := d.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, digestFunctionSQL); err != nil {
		return nil, fmt.Errorf("digest of the tables: %w", err)
	}
	rows, err := tx.Query(ctx, digestSQL, d.skip)
	if err != nil {
		return nil, fmt.Errorf("digest of the tables: %w", err)
	}
	digest := Digest{}
	for rows.Next() {
		var name, sum string
		if err := rows.Scan(&name, &sum); err != nil {
			return nil, err
		}
		digest[name] = sum
	}
	return digest, rows.Err()
}

// Changed returns the names of the tables whose rows differ between d and
// later, sorted.
func (d Digest) Changed(later Digest) []string {
	var changed []string
	for name, sum := range d {
		if later[name] != sum {
			changed = append(changed, name)
		}
	}
	for name := range later {
		if _, ok := d[name]; !ok {
			changed = append(changed, name)
		}
	}
	slices.Sort(changed)
	return changed
}

// Tables joins table names for a message.
func Tables(names []string) string { return strings.Join(names, ", ") }
