// Package sqltext retargets idem's embedded SQL at a table other than
// idempotency_keys.
//
// The SQL files name the table idempotency_keys so that psql can run them as
// they are; Rewrite replaces that name once per table, never per call.
package sqltext

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultTable is the table name the embedded SQL is written against.
const DefaultTable = "idempotency_keys"

var (
	plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	prefixRe   = regexp.MustCompile(`\bidempotency_keys_`)
	// relationRe matches the tables that belong to the key table (the state
	// of unfinished operations, schema/002): they take its schema too.
	relationRe = regexp.MustCompile(`\bidempotency_keys_(operations|steps)\b`)
	tableRe    = regexp.MustCompile(`\bidempotency_keys\b`)
)

// Table is a validated table name.
type Table struct {
	schema, name string
}

// ParseTable validates name: one or two plain identifiers ("keys" or
// "billing.keys"), lower case, each at most 63 bytes, since PostgreSQL would
// otherwise silently truncate them. Quoted identifiers are not accepted: the
// name is spliced into SQL text, and plain identifiers need no quoting.
func ParseTable(name string) (Table, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("table name %q: at most one dot (schema.table)", name)
	}
	for _, p := range parts {
		if len(p) == 0 || len(p) > 63 || !plainIdent.MatchString(p) {
			return Table{}, fmt.Errorf("table name %q: want lower-case letters, digits and underscores, not starting with a digit, 1 to 63 bytes per part", name)
		}
	}
	// Leave room for the longest derived name (_request_hash_length_check).
	if len(parts[len(parts)-1]) > 63-len("_request_hash_length_check") {
		return Table{}, fmt.Errorf("table name %q: table part longer than %d bytes", name, 63-len("_request_hash_length_check"))
	}
	if len(parts) == 2 {
		return Table{schema: parts[0], name: parts[1]}, nil
	}
	return Table{name: parts[0]}, nil
}

// Schema returns the schema part of the name, or "" if it was not given.
func (t Table) Schema() string { return t.schema }

// Name returns the table part of the name.
func (t Table) Name() string { return t.name }

// String returns the table as it appears in SQL, schema-qualified if it was
// given so.
func (t Table) String() string {
	if t.schema == "" {
		return pgx.Identifier{t.name}.Sanitize()
	}
	return pgx.Identifier{t.schema, t.name}.Sanitize()
}

// Relation returns the table that belongs to t with the given suffix
// ("_operations"): in t's schema, if it was given one.
func (t Table) Relation(suffix string) string {
	if t.schema == "" {
		return pgx.Identifier{t.name + suffix}.Sanitize()
	}
	return pgx.Identifier{t.schema, t.name + suffix}.Sanitize()
}

// Rewrite returns sql with the default table replaced by t: derived names
// (constraints, indexes) take t's unqualified name as their prefix.
func (t Table) Rewrite(sql string) string {
	if t.schema == "" && t.name == DefaultTable {
		return sql
	}
	sql = relationRe.ReplaceAllStringFunc(sql, func(m string) string {
		return t.Relation(m[len(DefaultTable):])
	})
	sql = prefixRe.ReplaceAllLiteralString(sql, t.name+"_")
	return tableRe.ReplaceAllLiteralString(sql, t.String())
}

// Retarget returns sql with the default table replaced by relation, a name
// as PostgreSQL prints a regclass (quoted where needed, qualified where not
// on the search_path): for statements on one partition of a key table. Names
// derived from the table (constraints, indexes) are left as they are.
func Retarget(sql, relation string) string {
	return tableRe.ReplaceAllLiteralString(sql, relation)
}
