-- operation_lock: the first statement of the transaction that begins or takes
-- over an operation: the key's advisory lock, claim.sql's, so that a Do
-- claiming the key and this transaction exclude each other, and the key's
-- row as this transaction's snapshot sees it after the lock.
--   $1 scope   $2 key   $3 the key's lock (lockKey in lockkey.go)
-- Returns one row: locked, and the row's request_hash and status (null if
-- there is none), and whether it is live (unfinished, or terminal within
-- its TTL).
SELECT pg_try_advisory_xact_lock($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32)),
       k.request_hash, k.status,
       k.status = 'unfinished'
       OR k.status <> 'in_progress'
          AND k.completed_at + (k.expires_at - k.created_at) > now()
FROM (SELECT 1) AS one
LEFT JOIN idempotency_keys AS k ON k.scope = $1 AND k.idempotency_key = $2
