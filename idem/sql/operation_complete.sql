-- operation_complete: the last step. In one statement, and so in one transaction:
-- the answer goes under the key, where Do, Lookup and every retry replay it
-- as any other key's, and the operation's state is deleted. The token
-- fences it like every other record.
--   $1 scope   $2 key   $3 token   $4 status ('completed' or 'refused')
--   $5 response   $6 refusal (jsonb), or null
-- Returns 1 when stored, 0 when the token is no longer the operation's.
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
    SET status = $4, response = $5, refusal = $6::jsonb, completed_at = clock_timestamp()
    WHERE scope = $1 AND idempotency_key = $2 AND status = 'unfinished'
      AND EXISTS (SELECT 1 FROM f)
    RETURNING 1
)
SELECT count(*) FROM k
