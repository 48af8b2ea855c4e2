-- count_partitions: the table and its partitions (a plain table is its own
-- only leaf) with their bounds, estimated rows, size with indexes and TOAST,
-- and whether the present falls in their range.
--   $1 the key table
SELECT t.relid::regclass::text,
       pg_get_expr(c.relpartbound, c.oid),
       greatest(c.reltuples, 0)::bigint,
       pg_total_relation_size(t.relid),
       coalesce(b[1]::timestamptz <= now() AND now() < b[2]::timestamptz, false),
       t.isleaf
FROM (
    -- pg_partition_tree lists nothing for a plain table.
    SELECT relid, isleaf FROM pg_partition_tree(to_regclass($1))
    UNION ALL
    SELECT to_regclass($1), true
    WHERE (SELECT relkind FROM pg_class WHERE oid = to_regclass($1)) <> 'p'
) AS t
JOIN pg_class c ON c.oid = t.relid
LEFT JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
    '^FOR VALUES FROM \(''([^'']*)''\) TO \(''([^'']*)''\)$') AS b ON true
WHERE t.isleaf
ORDER BY b[1]::timestamptz NULLS FIRST
