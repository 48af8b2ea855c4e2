-- layout: whether the key table is partitioned (relkind 'p'), as the
-- session's search_path resolves $1, the session's default isolation
-- level, which chooses the protocol of a call that does not set one (tx.go),
-- and whether the database has the Citus extension, whose protocol
-- (citusProtocol) then serves every call; no row if there is no such
-- table. Asked once per connection and table.
SELECT relkind = 'p', current_setting('default_transaction_isolation'),
       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
FROM pg_class WHERE oid = to_regclass($1)
