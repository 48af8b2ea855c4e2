-- operation_record_citus: operation_record.sql on a Citus cluster, routed
-- whole to the key's shard (both tables filtered by scope = $1 and
-- colocated); the lease runs from statement_timestamp() of the entry node.
--   $1 scope   $2 key   $3 token   $4 step   $5 output
--   $6 lease in microseconds   $7 the run (CallKey.Run)
-- Returns one row when recorded. When the token is no longer the
-- operation's it fails (division by zero, SQLSTATE 22012) and records
-- nothing: the step's row is written by INSERT ... VALUES, unconditionally,
-- since Citus would plan the plain layout's INSERT ... SELECT FROM f through
-- the entry node (intermediate results, and a two-phase commit) instead of
-- routing it; the failure undoes it with the rest of the statement.
WITH f AS (
    UPDATE idempotency_keys_operations
    SET lease_until = statement_timestamp() + $6::bigint * interval '1 microsecond'
    WHERE scope = $1 AND idempotency_key = $2 AND token = $3 AND run = $7::uuid
    RETURNING 1
),
s AS (
    INSERT INTO idempotency_keys_steps (scope, idempotency_key, step, output, token, run)
    VALUES ($1, $2, $4, $5, $3, $7::uuid)
    RETURNING 1
)
SELECT 1 / count(*)::int FROM f
