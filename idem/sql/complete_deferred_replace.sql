-- complete_deferred_replace: complete_deferred.sql for a key whose claim
-- found a row that is not live (expired, or 'in_progress' committed by
-- misuse): the row is replaced in place, as claim.sql replaces it. It must
-- fail rather than replace a live row or match nothing it may replace: the
-- division by zero (SQLSTATE 22012) aborts the transaction before COMMIT,
-- and Do reports ErrKeyLost. A row the sweeper deleted meanwhile is simply
-- inserted.
--   $1 scope   $2 key   $3 request hash   $4 status   $5 response
--   $6 refusal   $7 time to live in microseconds
WITH done AS (
    INSERT INTO idempotency_keys AS k
        (scope, idempotency_key, request_hash, status, response, refusal,
         created_at, completed_at, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6,
            now(), clock_timestamp(), now() + $7::bigint * interval '1 microsecond')
    ON CONFLICT (scope, idempotency_key) DO UPDATE
        SET request_hash = excluded.request_hash,
            status       = excluded.status,
            response     = excluded.response,
            refusal      = excluded.refusal,
            created_at   = excluded.created_at,
            completed_at = excluded.completed_at,
            expires_at   = excluded.expires_at
        WHERE k.status = 'in_progress'
           OR k.completed_at + (k.expires_at - k.created_at) <= now()
    RETURNING 1
)
SELECT CAST(CASE WHEN current_setting('idem.locked', true) = $1 || E'\x1f' || $2
            THEN '1' ELSE 'idem: the transaction that claimed the key has ended' END AS int)
       * (1 / count(*)::int)
FROM done
