-- operation_record: records a step's output. A database step sends it inside its
-- own transaction, after op_fence.sql, so the output commits with the
-- step's writes; an external step's output is sent after the call, in the
-- next transaction the owner commits (the next step's, or the next call's
-- fence), and the fence is in the statement: an owner that lost its lease
-- records nothing, and its caller repeats the call with the same derived
-- key.
--   $1 scope   $2 key   $3 token   $4 step   $5 output
--   $6 lease in microseconds
-- Returns one row when recorded, none when the token is no longer the
-- operation's.
WITH f AS (
    UPDATE idempotency_keys_operations
    SET lease_until = clock_timestamp() + $6::bigint * interval '1 microsecond'
    WHERE scope = $1 AND idempotency_key = $2 AND token = $3
    RETURNING run
)
INSERT INTO idempotency_keys_steps (scope, idempotency_key, step, output, token, run)
SELECT $1, $2, $4, $5, $3, f.run FROM f
RETURNING 1
