-- check: what Client.Check asks about the key table, in one statement that
-- reads the catalog and the session's settings only.
--   $1 the key table
-- Returns, in order:
--   the table as this session resolves it (null: there is none);
--   whether it is partitioned, and its partition key (pg_get_partkeydef);
--   the columns idem reads and writes that it lacks, or has with another
--   type, as 'name type';
--   whether it has the unique index a key's row is found and kept unique
--   by: (scope, idempotency_key), or on the partitioned layout, whose
--   unique indexes must hold the partition key, (scope, idempotency_key,
--   created_at);
--   whether a partition (or the DEFAULT one) accepts a key claimed now;
--   the role, and whether it may SELECT, INSERT, UPDATE and DELETE rows;
--   whether the session is read-only, and whether the server is a standby.
WITH t AS (SELECT to_regclass($1) AS oid)
SELECT t.oid::text,
       coalesce(c.relkind = 'p', false),
       pg_get_partkeydef(t.oid),
       ARRAY(SELECT e.name || ' ' || e.type
             FROM (VALUES ('scope', 'text'), ('idempotency_key', 'text'),
                          ('request_hash', 'text'), ('status', 'text'),
                          ('response', 'bytea'), ('refusal', 'jsonb'),
                          ('created_at', 'timestamp with time zone'),
                          ('completed_at', 'timestamp with time zone'),
                          ('expires_at', 'timestamp with time zone')) AS e(name, type)
             WHERE NOT EXISTS (
                 SELECT 1 FROM pg_attribute AS a
                 WHERE a.attrelid = t.oid AND a.attname = e.name AND NOT a.attisdropped
                   AND format_type(a.atttypid, a.atttypmod) = e.type))::text[],
       EXISTS (
           SELECT 1 FROM pg_index AS i
           WHERE i.indrelid = t.oid AND i.indisunique AND i.indimmediate
             AND i.indpred IS NULL
             AND ARRAY(SELECT a.attname::text
                       FROM unnest(i.indkey::int2[]) AS k(attnum)
                       LEFT JOIN pg_attribute AS a ON a.attrelid = t.oid AND a.attnum = k.attnum
                       ORDER BY 1)
                 = CASE WHEN c.relkind = 'p'
                        THEN ARRAY['created_at', 'idempotency_key', 'scope']
                        ELSE ARRAY['idempotency_key', 'scope'] END),
       c.relkind IS DISTINCT FROM 'p' OR EXISTS (
           SELECT 1
           FROM pg_inherits AS h
           JOIN pg_class AS p ON p.oid = h.inhrelid
           LEFT JOIN LATERAL regexp_match(pg_get_expr(p.relpartbound, p.oid),
               '^FOR VALUES FROM \(''([^'']*)''\) TO \(''([^'']*)''\)$') AS b ON true
           WHERE h.inhparent = t.oid
             AND (pg_get_expr(p.relpartbound, p.oid) = 'DEFAULT'
                  OR (b[1]::timestamptz <= now() AND now() < b[2]::timestamptz))),
       current_user::text,
       coalesce(has_table_privilege(t.oid, 'SELECT'), false),
       coalesce(has_table_privilege(t.oid, 'INSERT'), false),
       coalesce(has_table_privilege(t.oid, 'UPDATE'), false),
       coalesce(has_table_privilege(t.oid, 'DELETE'), false),
       current_setting('transaction_read_only') = 'on',
       pg_is_in_recovery()
FROM t
LEFT JOIN pg_class AS c ON c.oid = t.oid
