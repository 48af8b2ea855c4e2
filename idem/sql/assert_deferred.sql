-- assert_deferred: the second look of the deferred protocol, sent right
-- after claim_deferred.sql in the same pipeline and before BEGIN.
--   $1 scope   $2 key
-- At READ COMMITTED this statement takes a snapshot of its own, after the
-- claim took the key's lock, so it sees every first attempt that committed
-- before the lock was granted (PostgreSQL makes a commit visible before it
-- releases the committer's locks). It fails (division by zero, SQLSTATE
-- 22012) unless no live row of the key exists and this transaction holds
-- the key's lock; asking for a lock this transaction already holds only
-- counts it again. The failure aborts the implicit transaction before BEGIN
-- runs, so a replay, a key in progress and a lost race all leave the
-- connection idle after one round trip, with nothing written and no lock
-- kept.
--
-- (READ UNCOMMITTED is READ COMMITTED in PostgreSQL.) At REPEATABLE READ or
-- SERIALIZABLE (a session or database default) the
-- snapshot is the claim's and would not see that first attempt: the
-- statement returns -1 instead, and Do runs the call again with claim.sql,
-- whose insertion catches it.
SELECT CASE
    WHEN current_setting('transaction_isolation')
         NOT IN ('read committed', 'read uncommitted') THEN -1
    ELSE 1 / CASE
        WHEN EXISTS (
            SELECT 1 FROM idempotency_keys
            WHERE scope = $1 AND idempotency_key = $2
              AND status <> 'in_progress'
              AND completed_at + (expires_at - created_at) > now()
        ) THEN 0
        WHEN pg_try_advisory_xact_lock('idempotency_keys'::regclass::oid::int4,
                                       hashtext($1 || E'\x1f' || $2)) THEN 1
        ELSE 0
    END
END
