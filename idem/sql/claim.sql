-- claim: one statement that either claims the key for this transaction or
-- returns what a retry must see.
--   $1 scope   $2 key   $3 request hash   $4 time to live in microseconds
--   $5 the key's lock (lockKey in lockkey.go)
-- Returns one row: locked (null when a live row made locking needless),
-- claimed, and the live row's request_hash, status, response and refusal.
--
-- A live row (committed, terminal, completed less than its TTL ago) is
-- answered from the snapshot without locking or writing anything, so a
-- replay is a pure read. Otherwise the key is claimed under
-- pg_try_advisory_xact_lock: a concurrent holder makes the lock fail at once,
-- where a bare INSERT would wait on the holder's uncommitted row until it
-- ended. The unique primary key still decides who owns the key; the lock only
-- turns a wait into an immediate "in progress".
--
-- The lock is the bigint $5 (64 bits of SHA-256 of scope and key) XOR the
-- table's oid in its high half: the oid makes every spelling of one table
-- ("idempotency_keys", "public.idempotency_keys") take the same lock, and
-- the cryptographic hash keeps a tenant from choosing a key whose lock is
-- another tenant's. Keys that shared a lock anyway would only make one of
-- them answer "in progress" early; they can never both commit. A shared lock
-- on (the table's oid, 10 bits of $5), which blocks nobody, lets Stats and an
-- operator count the keys in progress in pg_locks (classid = the table's
-- oid, objsubid = 2); the 1024 values spread the claims over the lock
-- manager's partitions.
--
-- expires_at is created_at + TTL and is never updated (it is indexed, and
-- the completing update must stay HOT); a completed key lives until
-- completed_at + TTL, which is completed_at + (expires_at - created_at).
WITH cur AS (
    SELECT request_hash, status, response, refusal,
           -- An unfinished operation (idem.Operation) holds its key until
           -- its last step: a call gets ErrInProgress (replay.go).
           status = 'unfinished'
           OR status <> 'in_progress'
              AND completed_at + (expires_at - created_at) > now() AS live
    FROM idempotency_keys
    WHERE scope = $1 AND idempotency_key = $2
),
lk AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM cur WHERE live) THEN NULL
                WHEN pg_try_advisory_xact_lock($5::bigint # ('idempotency_keys'::regclass::oid::bigint << 32))
                     -- The table's counter for Stats, which excludes nobody.
                     AND pg_try_advisory_xact_lock_shared('idempotency_keys'::regclass::oid::int4, ($5::bigint & 1023)::int4)
                -- The marker the completing statement checks (complete.sql).
                THEN set_config('idem.locked', $1 || E'\x1f' || $2, true) IS NOT NULL
                ELSE false END AS locked
),
ins AS (
    INSERT INTO idempotency_keys AS k
        (scope, idempotency_key, request_hash, status, response, refusal,
         created_at, completed_at, expires_at)
    SELECT $1, $2, $3, 'in_progress', NULL, NULL,
           now(), NULL, now() + $4::bigint * interval '1 microsecond'
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
        WHERE k.status = 'in_progress'
           OR k.completed_at + (k.expires_at - k.created_at) <= now()
    RETURNING 1
)
SELECT (SELECT locked FROM lk),
       EXISTS (SELECT 1 FROM ins),
       cur.request_hash, cur.status, cur.response, cur.refusal
FROM (SELECT 1) AS one
LEFT JOIN cur ON cur.live
