-- forget: deletes a key's row unless a transaction holds the key right now.
-- The advisory lock keeps a concurrent claim out until this statement's
-- implicit transaction ends, and makes a busy key answer at once instead of
-- waiting on the holder's row lock.
--   $1 scope   $2 key   $3 the key's lock (claim.sql)
-- Returns: free (false: the key is in progress), deleted rows.
WITH lk AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32)) AS free
),
del AS (
    DELETE FROM idempotency_keys
    WHERE scope = $1 AND idempotency_key = $2 AND (SELECT free FROM lk)
    RETURNING 1
)
SELECT (SELECT free FROM lk), (SELECT count(*) FROM del)
