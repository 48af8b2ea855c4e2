-- operation_renew_citus: operation_renew.sql on a Citus cluster, for one
-- owner: the renewer sends one per owner, all in one pipeline. The plain
-- statement joins arrays of keys, which on Citus would span shards, where
-- Citus refuses FOR UPDATE; each of these is routed to its key's shard
-- (scope = $1) and commits there on its own (Citus commits each statement
-- of an implicit transaction as it ends), so a round costs the renewer one
-- round trip, and the entry node one statement per owner on the shards'
-- nodes.
--   $1 scope   $2 key   $3 token   $4 lease in microseconds
-- Returns whether the token is no longer the operation's. A row that a
-- transaction holds is skipped, as on the plain layout, and so is a lease
-- that has ended.
WITH held AS (
    SELECT 1
    FROM idempotency_keys_operations
    WHERE scope = $1 AND idempotency_key = $2 AND token = $3
      AND lease_until > statement_timestamp()
    FOR UPDATE SKIP LOCKED
),
renewed AS (
    UPDATE idempotency_keys_operations
    SET lease_until = statement_timestamp() + $4::bigint * interval '1 microsecond'
    WHERE scope = $1 AND idempotency_key = $2 AND token = $3
      AND EXISTS (SELECT 1 FROM held)
)
SELECT NOT EXISTS (
    SELECT 1 FROM idempotency_keys_operations
    WHERE scope = $1 AND idempotency_key = $2 AND token = $3)
