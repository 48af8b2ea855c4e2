-- stats: the health of the key table, for dashboards, in one statement that
-- reads catalog figures, the lock table, and the expired end of the index on
-- expires_at; no other row of the table.
--   $1 the most expired keys to count
--
-- Keys in progress are uncommitted rows, which no query on the table can
-- see; each holds the claim's shared advisory lock on (the table's oid, 10
-- bits of the key's lock: see claim.sql), which pg_locks shows as locktype
-- 'advisory', classid = the table's oid, objsubid = 2, in this database.
-- Their age is that of the holding transaction (pg_stat_activity).
--
-- The row count is the planner's estimate: reltuples (kept by VACUUM and
-- ANALYZE) scaled to the table's current number of pages, as the planner
-- scales it; 0 for a table without pages, -1 while no VACUUM or ANALYZE
-- has measured it. Expired keys are counted through the index on
-- expires_at (index-only once the visibility map covers their pages).
-- The last column says whether the database has the Citus extension: there
-- the table on this node is an empty shell, and Client.Stats reads the
-- shards with stats_citus.sql instead.
WITH t AS (
    SELECT c.oid, c.reltuples, c.relpages,
           pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages,
           pg_total_relation_size(c.oid) AS bytes
    FROM pg_class AS c
    WHERE c.oid = 'idempotency_keys'::regclass
),
held AS (
    SELECT count(*) AS n, min(a.xact_start) AS oldest
    FROM pg_locks AS l
    LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.classid = (SELECT oid FROM t)
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT CASE WHEN t.pages = 0 THEN 0
            WHEN t.reltuples < 0 OR t.relpages = 0 THEN -1
            ELSE round(t.reltuples / t.relpages * t.pages)::bigint END,
       (SELECT count(*) FROM (SELECT 1 FROM idempotency_keys
                              WHERE expires_at <= now() LIMIT $1) AS e),
       held.n,
       coalesce((extract(epoch FROM clock_timestamp() - held.oldest) * 1000000)::bigint, 0),
       t.bytes,
       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
FROM t, held
