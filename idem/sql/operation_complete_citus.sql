-- operation_complete_citus: operation_complete.sql on a Citus cluster,
-- routed whole to the key's shard; completed_at is statement_timestamp()
-- of the entry node (Citus refuses volatile functions in an UPDATE).
--   $1 scope   $2 key   $3 token   $4 status   $5 response   $6 refusal
WITH f AS (
    DELETE FROM idempotency_keys_operations
    WHERE scope = $1 AND idempotency_key = $2 AND token = $3
    RETURNING 1
),
st AS (
    DELETE FROM idempotency_keys_steps
    WHERE scope = $1 AND idempotency_key = $2 AND EXISTS (SELECT 1 FROM f)
),
k AS (
    UPDATE idempotency_keys
    SET status = $4, response = $5, refusal = $6::jsonb, completed_at = statement_timestamp()
    WHERE scope = $1 AND idempotency_key = $2 AND status = 'unfinished'
      AND EXISTS (SELECT 1 FROM f)
    RETURNING 1
)
SELECT count(*) FROM k
