-- stored: whether a committed row holds the key, in any scope. The kits'
-- keys are random UUIDs, so the key alone names the row they made.
--   $1 key
SELECT EXISTS (SELECT 1 FROM idempotency_keys WHERE idempotency_key = $1)
