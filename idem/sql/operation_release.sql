-- operation_release: ends the owner's lease now, with the error it stopped on, so
-- that the next retry or the completer resumes at once rather than after
-- the lease.
--   $1 scope   $2 key   $3 token   $4 the error
UPDATE idempotency_keys_operations
SET lease_until = now(), last_error = $4
WHERE scope = $1 AND idempotency_key = $2 AND token = $3
