-- op_renew: extends the owner's lease while it works (lease.go).
--   $1 scope   $2 key   $3 token   $4 lease in microseconds
-- Affects no row once another owner took the operation over.
UPDATE idempotency_keys_operations
SET lease_until = clock_timestamp() + $4::bigint * interval '1 microsecond'
WHERE scope = $1 AND idempotency_key = $2 AND token = $3
