-- operation_begin_citus: operation_begin.sql on a Citus cluster, in the
-- transaction operation_lock.sql locked. Every table is filtered by the
-- distribution column (scope = $1) and colocated, so Citus routes the
-- whole statement to the key's shard. Citus evaluates the functions of an
-- INSERT on the node the call entered through and accepts only IMMUTABLE
-- ones in ON CONFLICT: the expiry test compares intervals against
-- excluded.created_at (as insert_citus.sql does), and the token comes from
-- operation_token_citus.sql.
--   $1 scope   $2 key   $3 request hash   $4 time to live in microseconds
--   $5 operation name   $6 encoded request   $7 lease in microseconds
--   $8 deadline in microseconds, or null   $9 the run's identity
--   $10 the owner's token (operation_token_citus.sql)
-- Returns the owner's token. On a live key it fails (division by zero,
-- SQLSTATE 22012) and changes nothing: the operation's row is written by
-- INSERT ... VALUES, unconditionally, since Citus would plan the plain
-- layout's INSERT ... SELECT FROM k through the entry node (intermediate
-- results, and a two-phase commit) instead of routing it; the failure
-- undoes it with the rest of the statement.
WITH k AS (
    INSERT INTO idempotency_keys AS k
        (scope, idempotency_key, request_hash, status, response, refusal,
         created_at, completed_at, expires_at)
    VALUES ($1, $2, $3, 'unfinished', NULL, NULL,
            now(), NULL, now() + $4::bigint * interval '1 microsecond')
    ON CONFLICT (scope, idempotency_key) DO UPDATE
        SET request_hash = excluded.request_hash,
            status       = 'unfinished',
            response     = NULL,
            refusal      = NULL,
            created_at   = excluded.created_at,
            completed_at = NULL,
            expires_at   = excluded.expires_at
        WHERE k.status = 'in_progress'
           OR excluded.created_at - k.completed_at >= k.expires_at - k.created_at
    RETURNING 1
),
old AS (
    DELETE FROM idempotency_keys_steps
    WHERE scope = $1 AND idempotency_key = $2 AND EXISTS (SELECT 1 FROM k)
),
o AS (
    INSERT INTO idempotency_keys_operations AS o
        (scope, idempotency_key, operation, request, run, token, lease_until, deadline_at, created_at)
    VALUES ($1, $2, $5, $6, $9::uuid, $10::bigint, now() + $7::bigint * interval '1 microsecond',
            now() + $8::bigint * interval '1 microsecond', now())
    ON CONFLICT (scope, idempotency_key) DO UPDATE
        SET operation   = excluded.operation,
            request     = excluded.request,
            run         = excluded.run,
            begun       = '{}',
            token       = excluded.token,
            lease_until = excluded.lease_until,
            deadline_at = excluded.deadline_at,
            attempts    = 1,
            last_error  = NULL,
            created_at  = excluded.created_at
    RETURNING o.token
)
SELECT o.token / (SELECT count(*) FROM k) FROM o
