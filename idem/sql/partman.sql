-- partman: the schema of the pg_partman extension if it manages the key
-- table (part_config names the table schema-qualified); no row otherwise.
-- The extension's schema is only known at run time, so the sweeper asks its
-- part_config in a second statement.
--   $1 the key table
SELECT e.extnamespace::regnamespace::text,
       n.nspname || '.' || c.relname
FROM pg_extension e, pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE e.extname = 'pg_partman' AND c.oid = to_regclass($1)
