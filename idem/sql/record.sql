-- record: a key's row for an operator, whatever its state, and whether a
-- transaction holds the key right now (its row, if new, is not visible yet):
-- another session holds the claim's advisory lock, as pg_locks shows it.
-- It takes no lock of its own, so it never delays a claim.
--   $1 scope   $2 key   $3 the key's lock (claim.sql): the bigint form, which
--   pg_locks shows as classid = its high half, objid = its low half,
--   objsubid = 1
SELECT busy.held, k.request_hash, k.status, k.response, k.refusal,
       k.created_at, k.completed_at,
       coalesce(k.completed_at, k.created_at) + (k.expires_at - k.created_at)
FROM (SELECT EXISTS (
          SELECT 1 FROM pg_locks
          WHERE locktype = 'advisory' AND objsubid = 1 AND granted
            AND pid <> pg_backend_pid()
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND classid = ((($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32)) >> 32) & 4294967295)::oid
            AND objid = (($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32)) & 4294967295)::oid
      ) AS held) AS busy
LEFT JOIN idempotency_keys AS k ON k.scope = $1 AND k.idempotency_key = $2
