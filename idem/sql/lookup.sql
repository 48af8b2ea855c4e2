-- lookup: the live row for a key, if any. Used when a claim lost a race it
-- could not see from its own snapshot, and by the bounded wait.
--   $1 scope   $2 key
SELECT request_hash, status, response, refusal
FROM idempotency_keys
WHERE scope = $1 AND idempotency_key = $2
  AND (status = 'unfinished'
       OR status <> 'in_progress'
          AND completed_at + (expires_at - created_at) > now())
