-- record: a key's row for an operator, whatever its state, and whether a
-- transaction holds the key right now (its row, if new, is not visible yet).
-- The advisory lock taken to probe is released when this statement's
-- implicit transaction ends.
--   $1 scope   $2 key
SELECT NOT busy.free, k.request_hash, k.status, k.response, k.refusal,
       k.created_at, k.completed_at,
       coalesce(k.completed_at, k.created_at) + (k.expires_at - k.created_at)
FROM (SELECT pg_try_advisory_xact_lock('idempotency_keys'::regclass::oid::int4,
                                       hashtext($1 || E'\x1f' || $2)) AS free) AS busy
LEFT JOIN idempotency_keys AS k ON k.scope = $1 AND k.idempotency_key = $2
