-- resolve_tables: the tables named in $1, with null for a name that names
-- no table.
--   $1 names (text[])
SELECT name, to_regclass(name)::text FROM unnest($1::text[]) AS name
