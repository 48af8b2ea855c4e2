-- record_citus: record.sql on a Citus cluster. The claim's advisory lock is
-- held on the node that holds the key's shard (claim_citus.sql), and a
-- query of pg_locks runs on the node the lookup entered through (Citus
-- plans a catalog table apart from the shards), which would see a key in
-- progress only when that is the shard's node. So the question is put to
-- the lock itself, in the SELECT Citus routes whole to the shard's node:
-- a session-level shared lock on the claim's key is tried and, if granted,
-- released in the same expression. It fails while a claim holds the key
-- exclusively. The price: for the instant between the two, a claim of the
-- key entering then answers "in progress" and is retried by its caller.
-- The lookup's own session never conflicts with itself, as record.sql
-- skips its own backend.
--   $1 scope   $2 key   $3 the key's lock (lockKey in lockkey.go)
SELECT CASE WHEN pg_try_advisory_lock_shared($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32))
            THEN NOT pg_advisory_unlock_shared($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32))
            ELSE true END,
       k.request_hash, k.status, k.response, k.refusal,
       k.created_at, k.completed_at,
       coalesce(k.completed_at, k.created_at) + (k.expires_at - k.created_at)
FROM (SELECT 1) AS one
LEFT JOIN idempotency_keys AS k ON k.scope = $1 AND k.idempotency_key = $2
