-- operation_layout: whether the key table is partitioned, and whether the
-- database has the Citus extension. Operations run on the plain layout
-- only: a partition is dropped whole once its keys expire, and an
-- unfinished operation's key must outlive that. On Citus they use the
-- statements of newOpCitusSQL (statements.go).
SELECT relkind = 'p', EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
FROM pg_class WHERE oid = 'idempotency_keys'::regclass
