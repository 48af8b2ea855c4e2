-- claim_citus: the claim on a Citus cluster (citusProtocol), sent inside
-- the call's transaction, after BEGIN.
--   $1 scope   $2 key   $3 the key's lock (lockKey in lockkey.go)
-- Returns one row: locked (null when a live row made locking needless), and
-- the live row's request_hash, status, response and refusal. Fails
-- (division by zero, SQLSTATE 22012) when another transaction holds the
-- key's lock: the key is in progress, and insert_citus.sql is skipped.
--
-- A SELECT on one shard of the key table, filtered by the distribution
-- column (scope = $1): Citus routes it whole, functions included, to the
-- node that holds the shard, in the worker transaction it keeps open for
-- this call's transaction. So the advisory lock is taken on the shard's
-- node whichever node the call entered through, and held until the call's
-- transaction ends: two calls of one key exclude each other there. The
-- shared lock on (the table's oid there, 10 bits of the key's lock) is
-- claim.sql's counting lock, which Client.Stats counts on every node
-- (stats_citus.sql). The marker idem.locked is set in that same worker
-- transaction, where complete_citus.sql, routed there too, reads it. (The
-- join of a constant row with the shard keeps the query on the shard when
-- the key has no row.)
SELECT CASE WHEN k.status = 'unfinished'
                 OR k.status <> 'in_progress'
                    AND k.completed_at + (k.expires_at - k.created_at) > now()
            THEN NULL
            ELSE 1 / (pg_try_advisory_xact_lock($3::bigint # ('idempotency_keys'::regclass::oid::bigint << 32))
                      AND pg_try_advisory_xact_lock_shared('idempotency_keys'::regclass::oid::int4, ($3::bigint & 1023)::int4)
                      AND set_config('idem.locked', $1 || E'\x1f' || $2, true) IS NOT NULL)::int = 1
       END,
       k.request_hash, k.status, k.response, k.refusal
FROM (SELECT 1) AS one
LEFT JOIN idempotency_keys AS k ON k.scope = $1 AND k.idempotency_key = $2
