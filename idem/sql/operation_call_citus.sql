-- operation_call_citus: operation_call.sql on a Citus cluster, routed to
-- the key's shard; the lease runs from statement_timestamp() of the entry
-- node (Citus refuses volatile functions in an UPDATE).
--   $1 scope   $2 key   $3 token   $4 step   $5 lease in microseconds
UPDATE idempotency_keys_operations
SET lease_until = statement_timestamp() + $5::bigint * interval '1 microsecond',
    begun       = CASE WHEN $4 = ANY (begun) THEN begun ELSE array_append(begun, $4::text) END
WHERE scope = $1 AND idempotency_key = $2 AND token = $3
RETURNING 1
