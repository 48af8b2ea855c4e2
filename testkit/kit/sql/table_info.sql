-- table_info: the key table's oid and schema, or no row if there is no such
-- table.
--   $1 the table's name as idem spells it
SELECT c.oid::regclass::text, c.relnamespace::regnamespace::text
FROM pg_class c
WHERE c.oid = to_regclass($1)
