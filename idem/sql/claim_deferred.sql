-- claim_deferred: the claim of the deferred protocol (pipeline.go), the
-- default on a plain table at READ COMMITTED. It writes nothing: it answers
-- a live row from the snapshot, as claim.sql does, and otherwise takes the
-- key's advisory lock. The key's row is written once, completed, by
-- complete_deferred.sql in the round trip that carries COMMIT, instead of
-- being inserted here and updated there.
--   $1 scope   $2 key   $3 the key's lock (lockKey in lockkey.go)
-- Returns one row: locked (null when a live row made locking needless), and
-- the live row's request_hash, status, response and refusal.
--
-- Holding the lock is not yet owning the key: this statement's snapshot
-- predates the lock, and a first attempt that committed (releasing the
-- lock) in between is invisible here. assert_deferred.sql looks again. A
-- lock taken is recorded in the transaction-local setting idem.locked
-- (scope, 0x1f, key), which that statement reads: asking for the lock again
-- there would take it afresh when this claim did not get it.
-- The locks are claim.sql's.
WITH cur AS (
    SELECT request_hash, status, response, refusal,
           -- An unfinished operation holds its key (claim.sql).
           status = 'unfinished'
           OR status <> 'in_progress'
              AND completed_at + (expires_at - created_at) > now() AS live
    FROM idempotency_keys
    WHERE scope = $1 AND idempotency_key = $2
)
SELECT CASE WHEN cur.live THEN NULL
            WHEN pg_try_advisory_xact_lock($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32))
                 -- The table's counter for Stats, which excludes nobody.
                 AND pg_try_advisory_xact_lock_shared('idempotency_keys'::regclass::oid::int4, ($3::bigint & 1023)::int4)
            THEN set_config('idem.locked', $1 || E'\x1f' || $2, true) IS NOT NULL
            ELSE false END,
       CASE WHEN cur.live THEN cur.request_hash END,
       CASE WHEN cur.live THEN cur.status END,
       CASE WHEN cur.live THEN cur.response END,
       CASE WHEN cur.live THEN cur.refusal END
FROM (SELECT 1) AS one
LEFT JOIN cur ON true
