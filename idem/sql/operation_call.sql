-- operation_call: the fence of an external step, sent on its own right before the
-- call goes out: the owner's token must still be the operation's, and the
-- step is marked begun, so that from here on the operation knows the
-- provider may act under the step's derived key even if no output is ever
-- recorded (Steps.Unrecorded, for Compensate). It renews the lease, so the
-- call has a whole lease before anyone may take the operation over.
--   $1 scope   $2 key   $3 token   $4 step   $5 lease in microseconds
-- Returns one row while the owner holds the operation, none after it lost
-- it: then nothing is called.
UPDATE idempotency_keys_operations
SET lease_until = clock_timestamp() + $5::bigint * interval '1 microsecond',
    begun       = CASE WHEN $4 = ANY (begun) THEN begun ELSE array_append(begun, $4::text) END
WHERE scope = $1 AND idempotency_key = $2 AND token = $3
RETURNING 1
