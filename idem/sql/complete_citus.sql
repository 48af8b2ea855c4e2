-- complete_citus: complete.sql on a Citus cluster. Citus routes the whole
-- statement to the key's shard, the outer SELECT included, so the marker
-- check reads the worker transaction's idem.locked, which claim_citus.sql
-- set: a transaction that fn ended and began anew has lost it. The
-- functions of an UPDATE are evaluated on the node the call entered
-- through, where only STABLE ones are accepted: completed_at is
-- statement_timestamp() there, the start of this statement, in the round
-- trip that carries COMMIT.
--   $1 scope   $2 key   $3 status ('completed' or 'refused')
--   $4 response   $5 refusal
WITH done AS (
    UPDATE idempotency_keys
    SET status = $3, response = $4, refusal = $5, completed_at = statement_timestamp()
    WHERE scope = $1 AND idempotency_key = $2 AND status = 'in_progress'
    RETURNING 1
)
SELECT CAST(CASE WHEN current_setting('idem.locked', true) = $1 || E'\x1f' || $2
            THEN '1' ELSE 'idem: the transaction that claimed the key has ended' END AS int)
       * (1 / count(*)::int)
FROM done
