-- operation_layout: whether the key table is partitioned. Operations run on the
-- plain layout only: a partition is dropped whole once its keys expire,
-- and an unfinished operation's key must outlive that.
SELECT relkind = 'p' FROM pg_class WHERE oid = 'idempotency_keys'::regclass
