-- operation_peek: what a call of an operation (operation.go) finds under its key,
-- read without a transaction, so that a replay, a mismatch and an owner at
-- work are answered in one round trip.
--   $1 scope   $2 key
-- Returns the live row's request_hash, status, response and refusal, and,
-- for an unfinished operation, whether its owner's lease is still running
-- (null when no operation row exists). No row: the key is free or expired.
SELECT k.request_hash, k.status, k.response, k.refusal,
       o.lease_until > now()
FROM idempotency_keys AS k
LEFT JOIN idempotency_keys_operations AS o
       ON o.scope = k.scope AND o.idempotency_key = k.idempotency_key
WHERE k.scope = $1 AND k.idempotency_key = $2
  AND (k.status = 'unfinished'
       OR k.status <> 'in_progress'
          AND k.completed_at + (k.expires_at - k.created_at) > now())
