-- forget: deletes a key's row, and an unfinished operation's state with it,
-- unless a transaction holds the key right now.
--   $1 scope   $2 key   $3 the key's lock (claim.sql)
-- Returns: free (false: the key is in progress, or changed while this
-- statement ran), deleted rows.
--
-- Nothing here waits on a lock, so a busy key answers at once:
--  - the advisory lock keeps a concurrent claim, and an operation's first
--    step, out until this statement's implicit transaction ends;
--  - the operation's row is locked first (SKIP LOCKED: a row that its
--    owner's database step holds, or that changed since the snapshot, is
--    missing from the locked set), in the order an operation's step locks
--    the two tables (op_fence.sql, then op_complete.sql), so that a
--    Forget and a last step never deadlock.
-- The statement's snapshot is taken before the locks: a claim or an
-- operation's first step that committed in between is not in it. The
-- delete of the key's row would still find that row's new version (READ
-- COMMITTED rechecks a changed row), while the deletes of the operation's
-- state cannot see a row inserted after the snapshot: the key would go and
-- a new operation's state stay behind. So the key's rows go only as the
-- snapshot saw them (their xmin, cur: the partitioned layout may hold a
-- key in several partitions; a version committed after the snapshot has
-- an xmin no row in it has), and a row that changed answers "in progress",
-- for the caller to look again.
WITH lk AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32))
           AND (SELECT count(*) FROM (
                    SELECT 1 FROM idempotency_keys_operations
                    WHERE scope = $1 AND idempotency_key = $2
                    FOR UPDATE SKIP LOCKED) AS locked)
             = (SELECT count(*) FROM idempotency_keys_operations
                WHERE scope = $1 AND idempotency_key = $2) AS free
),
cur AS MATERIALIZED (
    SELECT xmin AS x FROM idempotency_keys
    WHERE scope = $1 AND idempotency_key = $2
),
del AS (
    DELETE FROM idempotency_keys
    WHERE scope = $1 AND idempotency_key = $2 AND (SELECT free FROM lk)
      AND xmin IN (SELECT x FROM cur)
    RETURNING 1
),
-- An unfinished operation's state goes with its key (schema/002); a
-- data-modifying WITH runs whether or not the query reads it.
op AS (
    DELETE FROM idempotency_keys_operations
    WHERE scope = $1 AND idempotency_key = $2 AND EXISTS (SELECT 1 FROM del)
),
st AS (
    DELETE FROM idempotency_keys_steps
    WHERE scope = $1 AND idempotency_key = $2 AND EXISTS (SELECT 1 FROM del)
)
SELECT (SELECT free FROM lk) AND (EXISTS (SELECT 1 FROM del) OR NOT EXISTS (SELECT 1 FROM cur)),
       (SELECT count(*) FROM del)
