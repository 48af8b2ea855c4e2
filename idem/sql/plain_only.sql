-- plain_only: fails (division by zero) if the key table is partitioned. Sweep
-- runs it before the plain batched DELETE when it cannot ask which layout
-- the table has: on a partitioned table that DELETE's ctids would be
-- ambiguous across partitions.
--   $1 the key table
SELECT 1 / (relkind <> 'p')::int FROM pg_class WHERE oid = to_regclass($1)
