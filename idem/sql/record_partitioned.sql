-- record_partitioned: record.sql for the partitioned layout, where a key may
-- have several rows: the live one if there is one, else the newest.
--   $1 scope   $2 key   $3 the key's lock (claim.sql)
SELECT NOT busy.free, k.request_hash, k.status, k.response, k.refusal,
       k.created_at, k.completed_at,
       coalesce(k.completed_at, k.created_at) + (k.expires_at - k.created_at)
FROM (SELECT pg_try_advisory_xact_lock($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32)) AS free) AS busy
LEFT JOIN LATERAL (
    SELECT *
    FROM idempotency_keys
    WHERE scope = $1 AND idempotency_key = $2
    ORDER BY status <> 'in_progress'
             AND completed_at + (expires_at - created_at) > now() DESC,
             created_at DESC
    LIMIT 1
) AS k ON true
