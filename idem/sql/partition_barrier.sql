-- partition_barrier: waits (up to lock_timeout) until no transaction that
-- has touched the partition is running, and holds it for an instant. Every
-- claim reads every partition, so it locks this one before it computes its
-- created_at (claim_partitioned.sql): once the partition's range has
-- passed, no row can enter it after this lock, and every row written before
-- has committed or rolled back. What partition_census.sql then reads is
-- final.
LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE
