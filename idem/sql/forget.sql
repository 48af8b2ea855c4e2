-- forget: deletes a key's row, and an unfinished operation's state with it,
-- unless a transaction holds the key right now.
--   $1 scope   $2 key   $3 the key's lock (claim.sql)
-- Returns: free (false: the key is in progress, or changed while this
-- statement ran), deleted rows.
--
-- Nothing here waits on a lock, so a busy key answers at once, and nothing
-- deletes a row this statement's snapshot did not see:
--  - the advisory lock keeps a concurrent claim, and an operation's first
--    step or takeover, out until this statement's implicit transaction
--    ends;
--  - then the operation's rows and the key's rows are locked with SKIP
--    LOCKED, each only as the snapshot saw it (its xmin): a row that a
--    database step, an external step's record, a sweep or a claim holds,
--    or that one of them changed or deleted after the snapshot (READ
--    COMMITTED would lock its newest version), is missing from the locked
--    set, and the key answers "in progress", for the caller to look again.
--    A row inserted after the snapshot needs a change to the key's row
--    (op_begin.sql) or the operation's (op_record.sql), which shows.
-- So the deletes below find exactly the rows locked here: the key never
-- goes without its operation's state, nor the reverse.
WITH lk AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32))
           AND (SELECT count(*) FROM (
                    SELECT 1 FROM idempotency_keys_operations
                    WHERE scope = $1 AND idempotency_key = $2
                      AND xmin IN (SELECT xmin FROM idempotency_keys_operations
                                   WHERE scope = $1 AND idempotency_key = $2)
                    FOR UPDATE SKIP LOCKED) AS o)
             = (SELECT count(*) FROM idempotency_keys_operations
                WHERE scope = $1 AND idempotency_key = $2)
           AND (SELECT count(*) FROM (
                    SELECT 1 FROM idempotency_keys
                    WHERE scope = $1 AND idempotency_key = $2
                      AND xmin IN (SELECT xmin FROM idempotency_keys
                                   WHERE scope = $1 AND idempotency_key = $2)
                    FOR UPDATE SKIP LOCKED) AS k)
             = (SELECT count(*) FROM idempotency_keys
                WHERE scope = $1 AND idempotency_key = $2) AS free
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
