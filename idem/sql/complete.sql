-- complete: records the outcome before COMMIT. Only non-indexed columns
-- change, which keeps the update HOT-eligible. completed_at is the clock at
-- completion, not now() (the transaction's start): the key's TTL counts from
-- here. It is pipelined with COMMIT, so it must fail rather than match no row
-- (fn deleted or changed its own key, say): the division by zero (SQLSTATE
-- 22012) aborts the transaction before COMMIT, and Do reports ErrKeyLost.
--   $1 scope   $2 key   $3 status ('completed' or 'refused')
--   $4 response   $5 refusal
WITH done AS (
    UPDATE idempotency_keys
    SET status = $3, response = $4, refusal = $5, completed_at = clock_timestamp()
    WHERE scope = $1 AND idempotency_key = $2 AND status = 'in_progress'
    RETURNING 1
)
SELECT CAST(CASE WHEN current_setting('idem.locked', true) = $1 || E'\x1f' || $2
            THEN '1' ELSE 'idem: the transaction that claimed the key has ended' END AS int)
       * (1 / count(*)::int)
FROM done
