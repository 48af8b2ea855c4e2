-- check_citus: what Client.Check asks on a database with the Citus
-- extension, from the catalog of the node it runs on (the coordinator's, or
-- a worker's copy with metadata synced).
--   $1 the key table   $2 the table it must be colocated with
--   (Config.ColocateWith), or ''
-- Returns, in order:
--   the key table's distribution column, or null when it is not
--   hash-distributed (a local table, a reference table);
--   whether any other table is hash-distributed (the business tables);
--   the tables of unfinished operations that exist and are not distributed
--   by scope in the key table's colocation group;
--   the table $2 as this session resolves it (null: none, or $2 empty);
--   whether it is hash-distributed, and whether the key table is
--   colocated with it.
WITH t AS (SELECT to_regclass($1) AS oid),
k AS (
    SELECT p.partmethod, p.colocationid,
           CASE WHEN p.partmethod = 'h' THEN column_to_column_name(p.logicalrelid, p.partkey) END AS col
    FROM pg_dist_partition AS p, t
    WHERE p.logicalrelid = t.oid
),
w AS (SELECT to_regclass(nullif($2, '')) AS oid),
idem AS (
    SELECT r FROM unnest(ARRAY[to_regclass('idempotency_keys_operations'),
                               to_regclass('idempotency_keys_steps')]) AS r
    WHERE r IS NOT NULL
)
SELECT (SELECT col FROM k),
       EXISTS (SELECT 1 FROM pg_dist_partition AS p, t
               WHERE p.partmethod = 'h' AND p.logicalrelid IS DISTINCT FROM t.oid
                 AND p.logicalrelid NOT IN (SELECT r FROM idem)),
       ARRAY(SELECT r::text FROM idem
             WHERE NOT EXISTS (
                 SELECT 1 FROM pg_dist_partition AS p, k
                 WHERE p.logicalrelid = idem.r AND p.partmethod = 'h' AND k.partmethod = 'h'
                   AND column_to_column_name(p.logicalrelid, p.partkey) = 'scope'
                   AND p.colocationid = k.colocationid))::text[],
       (SELECT oid::text FROM w),
       EXISTS (SELECT 1 FROM pg_dist_partition AS p, w WHERE p.logicalrelid = w.oid AND p.partmethod = 'h'),
       EXISTS (SELECT 1 FROM pg_dist_partition AS p, w, k
               WHERE p.logicalrelid = w.oid AND p.partmethod = 'h' AND k.partmethod = 'h'
                 AND p.colocationid = k.colocationid)
