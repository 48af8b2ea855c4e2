-- operation_fence: the first statement of a database step's transaction: the
-- owner's token must still be the operation's, and the row lock it takes
-- keeps every takeover out (op_take.sql's NOWAIT) until the step commits
-- or rolls back. It renews the lease, and sets the step's idle timeout
-- (Config.IdleTimeout) for the rest of the transaction.
--   $1 scope   $2 key   $3 token   $4 lease in microseconds
--   $5 idle_in_transaction_session_timeout in milliseconds, or null
-- Returns one row while the owner holds the operation, none after it lost
-- it.
UPDATE idempotency_keys_operations
SET lease_until = clock_timestamp() + $4::bigint * interval '1 microsecond'
WHERE scope = $1 AND idempotency_key = $2 AND token = $3
RETURNING CASE WHEN $5::text IS NULL THEN ''
               ELSE set_config('idle_in_transaction_session_timeout', $5::text, true) END
