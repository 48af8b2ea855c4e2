-- stats_citus: stats.sql on a Citus cluster, where the key table on the
-- node a query enters through is an empty shell: its catalog figures
-- (reltuples, relpages, size) and its lock table say nothing of the keys,
-- which live in shards on the workers. So each figure is read where the
-- keys are, in one statement that writes nothing:
--   $1 the most expired keys to count
--
-- the row estimate: stats.sql's per shard (run_command_on_shards, each
-- shard's reltuples scaled to its pages), summed; -1 while a shard with
-- pages has never been measured by VACUUM or ANALYZE;
-- the expired keys: the same count as stats.sql, which Citus runs on every
-- shard in parallel;
-- the keys in progress: the claim's shared counting lock (claim_citus.sql)
-- in pg_locks of every node (run_command_on_all_nodes), the key table's
-- oid on that node naming it, and the age of the oldest holder's
-- transaction there (the worker transaction Citus opened for the call,
-- which begins with the call's first statement on the shard);
-- the size: citus_total_relation_size, every shard with its indexes.
WITH t AS (
    SELECT format('%I.%I', n.nspname, c.relname) AS name
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = 'idempotency_keys'::regclass
),
shards AS (
    SELECT s.result::bigint AS rows
    FROM run_command_on_shards('idempotency_keys'::regclass, $$
        SELECT CASE WHEN pg_relation_size('%1$s') = 0 THEN 0
                    WHEN c.reltuples < 0 OR c.relpages = 0 THEN -1
                    ELSE round(c.reltuples / c.relpages
                               * (pg_relation_size('%1$s') / current_setting('block_size')::bigint))::bigint END
        FROM pg_class AS c WHERE c.oid = '%1$s'::regclass$$) AS s
),
held AS (
    SELECT sum(split_part(r.result, ' ', 1)::bigint) AS n,
           max(nullif(split_part(r.result, ' ', 2), '')::bigint) AS oldest
    FROM t, run_command_on_all_nodes(format($$
        SELECT count(*) || ' ' || coalesce(max((extract(epoch FROM clock_timestamp() - a.xact_start) * 1000000)::bigint)::text, '')
        FROM pg_locks AS l
        LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.classid = to_regclass(%L)
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())$$, t.name)) AS r
)
SELECT CASE WHEN bool_or(shards.rows < 0) THEN -1 ELSE coalesce(sum(shards.rows), 0) END,
       (SELECT count(*) FROM (SELECT 1 FROM idempotency_keys
                              WHERE expires_at <= now() LIMIT $1) AS e),
       (SELECT n FROM held),
       coalesce((SELECT oldest FROM held), 0),
       citus_total_relation_size('idempotency_keys'::regclass)
FROM shards
