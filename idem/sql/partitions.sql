-- partitions: the key table's partitions for the sweeper: name (quoted and
-- qualified as needed), schema and relation name, whether it is the DEFAULT
-- partition, and the range bounds of the others (as this session writes
-- them; null where they are not a plain FROM..TO range), and whether the
-- range has passed.
--   $1 the key table
SELECT c.oid::regclass::text, n.nspname, c.relname,
       pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT',
       b[1]::timestamptz, b[2]::timestamptz,
       coalesce(b[2]::timestamptz <= clock_timestamp(), false)
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
    '^FOR VALUES FROM \(''([^'']*)''\) TO \(''([^'']*)''\)$') AS b ON true
WHERE i.inhparent = to_regclass($1)
ORDER BY 5 NULLS FIRST
