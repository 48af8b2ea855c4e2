-- forget: deletes a key's row, and an unfinished operation's state with it,
-- unless a transaction holds the key right now.
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
),
-- An unfinished operation's state goes with its key (schema/002); a
-- data-modifying WITH runs whether or not the query reads it.
op AS (
    DELETE FROM idempotency_keys_operations
    WHERE scope = $1 AND idempotency_key = $2 AND (SELECT free FROM lk)
),
st AS (
    DELETE FROM idempotency_keys_steps
    WHERE scope = $1 AND idempotency_key = $2 AND (SELECT free FROM lk)
)
SELECT (SELECT free FROM lk), (SELECT count(*) FROM del)
