-- op_steps: the outputs an operation's steps recorded, read by a new owner
-- before it runs the operation again: recorded steps are not run twice.
--   $1 scope   $2 key
SELECT step, output
FROM idempotency_keys_steps
WHERE scope = $1 AND idempotency_key = $2
