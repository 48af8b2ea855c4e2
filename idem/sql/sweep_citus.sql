-- sweep_citus: sweep.sql on a Citus cluster. Citus refuses FOR UPDATE and
-- LIMIT in a DELETE over several shards, so this deletes every expired key
-- at once, each shard's in parallel on its node, in one distributed
-- transaction (a two-phase commit across the workers that held expired
-- keys). A row that a claim is replacing is waited for, then seen in its new
-- version, which is not expired. Citus evaluates now() on the node the
-- sweep entered through and refuses timestamptz + interval over columns
-- (STABLE), so the liveness test of sweep.sql compares intervals. $1, the batch size of the plain sweep,
-- only keeps the statement's signature.
--   $1 the batch size (unused but for its type)
DELETE FROM idempotency_keys
WHERE expires_at <= now()
  AND (status = 'in_progress'
       OR now() - completed_at >= expires_at - created_at)
  AND $1::int > 0
