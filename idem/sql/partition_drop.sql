-- partition_drop: drops a partition whose keys have all expired. PostgreSQL
-- takes an ACCESS EXCLUSIVE lock on the parent for it (DETACH ... CONCURRENTLY
-- is refused while a DEFAULT partition exists); the sweeper bounds the wait
-- with lock_timeout.
DROP TABLE idempotency_keys
