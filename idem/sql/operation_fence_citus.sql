-- operation_fence_citus: operation_fence.sql on a Citus cluster, routed to
-- the key's shard, whose row lock keeps every takeover out until the step
-- ends. Citus refuses volatile functions in an UPDATE: the lease runs from
-- statement_timestamp() of the entry node, the start of this statement,
-- the first of the step's transaction. The idle timeout is set apart, on
-- the entry node's session (setIdleTimeoutSQL), which is the one a paused
-- caller holds open: set here, it would reach the shard's node only.
--   $1 scope   $2 key   $3 token   $4 lease in microseconds
-- Returns one row while the owner holds the operation, none after it lost
-- it.
UPDATE idempotency_keys_operations
SET lease_until = statement_timestamp() + $4::bigint * interval '1 microsecond'
WHERE scope = $1 AND idempotency_key = $2 AND token = $3
RETURNING ''
