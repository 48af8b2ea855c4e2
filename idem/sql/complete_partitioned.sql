-- complete_partitioned: complete.sql for the partitioned layout. The key may
-- have older rows (expired, awaiting their partition's drop); $6, the
-- created_at the claim returned, names the row this call claimed.
--
-- created_at >= now() (the row was inserted in this transaction) prunes the
-- past partitions when the statement starts, in the cached generic plan. $6
-- is compared through an expression on purpose: a plain created_at = $6
-- would let a custom plan prune to one partition at planning time, which
-- makes PostgreSQL judge custom plans cheaper and plan this statement anew
-- on every call.
--   $1 scope   $2 key   $3 status ('completed' or 'refused')
--   $4 response   $5 refusal   $6 the claimed row's created_at
WITH done AS (
    UPDATE idempotency_keys
    SET status = $3, response = $4, refusal = $5, completed_at = clock_timestamp()
    WHERE scope = $1 AND idempotency_key = $2 AND status = 'in_progress'
      AND created_at >= now() AND created_at - $6 = interval '0'
    RETURNING 1
)
SELECT CAST(CASE WHEN current_setting('idem.locked', true) = $1 || E'\x1f' || $2
            THEN '1' ELSE 'idem: the transaction that claimed the key has ended' END AS int)
       * (1 / count(*)::int)
FROM done
