-- claim: one statement that either claims the key for this transaction or
-- returns what a retry must see.
--   $1 advisory lock id   $2 scope   $3 key   $4 request hash
--   $5 time to live in microseconds
-- Returns one row: locked (null when a live row made locking needless),
-- claimed, and the live row's request_hash, status, response and refusal.
--
-- A live (committed, unexpired) row is answered from the snapshot without
-- locking or writing anything, so a replay is a pure read. Otherwise the key
-- is claimed under pg_try_advisory_xact_lock: a concurrent holder makes the
-- lock fail at once, where a bare INSERT would wait on the holder's
-- uncommitted row until it ended. The unique primary key still decides who
-- owns the key; the lock only turns a wait into an immediate "in progress".
WITH cur AS (
    SELECT request_hash, status, response, refusal,
           expires_at > now() AND status <> 'in_progress' AS live
    FROM idempotency_keys
    WHERE scope = $2 AND idempotency_key = $3
),
lk AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM cur WHERE live) THEN NULL
                ELSE pg_try_advisory_xact_lock($1::bigint) END AS locked
),
ins AS (
    INSERT INTO idempotency_keys AS k
        (scope, idempotency_key, request_hash, status, response, refusal,
         created_at, completed_at, expires_at)
    SELECT $2, $3, $4, 'in_progress', NULL, NULL,
           now(), NULL, now() + $5::bigint * interval '1 microsecond'
    FROM lk WHERE lk.locked
    -- An expired row, or an 'in_progress' row that was committed by misuse,
    -- is replaced in place: the key is absent for every purpose.
    ON CONFLICT (scope, idempotency_key) DO UPDATE
        SET request_hash = excluded.request_hash,
            status       = 'in_progress',
            response     = NULL,
            refusal      = NULL,
            created_at   = excluded.created_at,
            completed_at = NULL,
            expires_at   = excluded.expires_at
        WHERE k.expires_at <= now() OR k.status = 'in_progress'
    RETURNING 1
)
SELECT (SELECT locked FROM lk),
       EXISTS (SELECT 1 FROM ins),
       cur.request_hash, cur.status, cur.response, cur.refusal
FROM (SELECT 1) AS one
LEFT JOIN cur ON cur.live
