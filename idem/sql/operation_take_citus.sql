-- operation_take_citus: operation_take.sql on a Citus cluster, in the
-- transaction operation_lock.sql locked, routed whole to the key's shard
-- (scope = $1), where FOR UPDATE NOWAIT locks the operation's row as on
-- the plain layout. The new token comes from operation_token_citus.sql
-- (Citus refuses nextval in an UPDATE), and whether the deadline passed is
-- read outside the UPDATE, whose RETURNING Citus allows no now() in.
--   $1 scope   $2 key   $3 lease in microseconds   $4 the new token
-- Returns what operation_take.sql returns.
WITH o AS MATERIALIZED (
    SELECT lease_until <= now() AS free
    FROM idempotency_keys_operations
    WHERE scope = $1 AND idempotency_key = $2
    FOR UPDATE NOWAIT
),
up AS (
    UPDATE idempotency_keys_operations
    SET token       = $4::bigint,
        lease_until = now() + $3::bigint * interval '1 microsecond',
        attempts    = attempts + 1
    WHERE scope = $1 AND idempotency_key = $2 AND (SELECT free FROM o)
    RETURNING token, operation, request, run::text AS run, begun, deadline_at
)
SELECT (SELECT free FROM o), up.token, up.operation, up.request, up.run, up.begun,
       coalesce(up.deadline_at <= now(), false)
FROM (SELECT 1) AS one
LEFT JOIN up ON true
