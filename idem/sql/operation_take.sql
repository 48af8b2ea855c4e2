-- operation_take: takes over an unfinished operation whose owner's lease has
-- ended, in the transaction op_lock.sql locked: a new token fences the old
-- owner out of every record it would still make.
--   $1 scope   $2 key   $3 lease in microseconds
-- Returns one row: free (null: no operation row; false: the lease is still
-- running, or the owner is inside a database step, whose transaction holds
-- the operation's row), and, when taken, the new token, the operation's
-- name, its stored request, its run, the external steps it began, and
-- whether its deadline has passed.
-- NOWAIT makes an owner inside a step answer "in progress" at once: that
-- step's writes and its record commit or roll back under the old token,
-- and no takeover happens in between.
WITH o AS MATERIALIZED (
    SELECT lease_until <= now() AS free
    FROM idempotency_keys_operations
    WHERE scope = $1 AND idempotency_key = $2
    FOR UPDATE NOWAIT
),
up AS (
    UPDATE idempotency_keys_operations
    SET token       = nextval(pg_get_serial_sequence('idempotency_keys_operations', 'token')),
        lease_until = now() + $3::bigint * interval '1 microsecond',
        attempts    = attempts + 1
    WHERE scope = $1 AND idempotency_key = $2 AND (SELECT free FROM o)
    RETURNING token, operation, request, run::text AS run, begun,
              coalesce(deadline_at <= now(), false) AS overdue
)
SELECT (SELECT free FROM o), up.token, up.operation, up.request, up.run, up.begun, up.overdue
FROM (SELECT 1) AS one
LEFT JOIN up ON true
