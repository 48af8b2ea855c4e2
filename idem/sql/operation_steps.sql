-- operation_steps: the outputs an operation's steps recorded in its current run,
-- read by a new owner before it runs the operation again: recorded steps
-- are not run again.
--   $1 scope   $2 key   $3 the run
SELECT step, output
FROM idempotency_keys_steps
WHERE scope = $1 AND idempotency_key = $2 AND run = $3::uuid
