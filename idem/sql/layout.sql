-- layout: whether the key table is partitioned (relkind 'p'), as the
-- session's search_path resolves $1; no row if there is no such table.
-- Asked once per connection and table.
SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)
