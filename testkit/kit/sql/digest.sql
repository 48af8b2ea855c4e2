-- digest: runs digest_function's function.
--   $1 tables to skip (text[] of regclass names)
SELECT name, digest FROM pg_temp.idemtest_digest($1::text[]::regclass[])
