-- operation_begin: begins an operation under a key that is free or expired, in the
-- transaction op_lock.sql locked: the key's row 'unfinished', which holds
-- the key against Do and every other call until the last step, and the
-- operation's row with the first owner's token and lease.
--   $1 scope   $2 key   $3 request hash   $4 time to live in microseconds
--   $5 operation name   $6 encoded request   $7 lease in microseconds
--   $8 deadline in microseconds, or null   $9 the run's identity (a new
--   random UUID)
-- Returns the owner's token. Steps a forgotten operation recorded under the
-- key are removed: they belong to another request. On a live key (an
-- operation that began after the caller's look, op_lock.sql, read its
-- snapshot) it returns no row and changes nothing, its steps included.
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
           OR k.completed_at + (k.expires_at - k.created_at) <= now()
    RETURNING 1
),
old AS (
    DELETE FROM idempotency_keys_steps
    WHERE scope = $1 AND idempotency_key = $2 AND EXISTS (SELECT 1 FROM k)
)
INSERT INTO idempotency_keys_operations AS o
    (scope, idempotency_key, operation, request, run, lease_until, deadline_at)
SELECT $1, $2, $5, $6, $9::uuid, now() + $7::bigint * interval '1 microsecond',
       now() + $8::bigint * interval '1 microsecond'
FROM k
ON CONFLICT (scope, idempotency_key) DO UPDATE
    SET operation   = excluded.operation,
        request     = excluded.request,
        run         = excluded.run,
        begun       = '{}',
        token       = nextval(pg_get_serial_sequence('idempotency_keys_operations', 'token')),
        lease_until = excluded.lease_until,
        deadline_at = excluded.deadline_at,
        attempts    = 1,
        last_error  = NULL,
        created_at  = now()
RETURNING o.token
