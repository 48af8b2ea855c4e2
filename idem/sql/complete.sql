-- complete: records the outcome before COMMIT. Only non-indexed columns
-- change, which keeps the update HOT-eligible. It is pipelined with COMMIT,
-- so it must fail rather than match no row (fn deleted the key, say): the
-- division by zero (SQLSTATE 22012) aborts the transaction before COMMIT.
--   $1 scope   $2 key   $3 status ('completed' or 'refused')
--   $4 response   $5 refusal
WITH done AS (
    UPDATE idempotency_keys
    SET status = $3, response = $4, refusal = $5, completed_at = now()
    WHERE scope = $1 AND idempotency_key = $2 AND status = 'in_progress'
    RETURNING 1
)
SELECT 1 / count(*)::int FROM done
