-- digest_function: a function, in the session's temporary schema and
-- created in a transaction that rolls back, that returns a digest of every
-- ordinary table's rows (their count and an order-independent sum of row
-- hashes), except the tables in skip and the kits' own tables. Sequences are
-- not tables: nextval survives a rollback, so they would change anyway.
CREATE FUNCTION pg_temp.idemtest_digest(skip regclass[])
RETURNS TABLE (name text, digest text)
LANGUAGE plpgsql AS $$
DECLARE
	t regclass;
BEGIN
	FOR t IN
		SELECT c.oid::regclass
		FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind = 'r'
		  AND c.relpersistence <> 't'
		  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
		  AND n.nspname NOT LIKE 'pg\_toast%'
		  AND c.relname NOT LIKE 'idemtest\_%'
		  AND c.oid <> ALL (skip::oid[])
		  AND has_table_privilege(c.oid, 'SELECT')
		ORDER BY c.oid::regclass::text
	LOOP
		name := t::text;
		EXECUTE format(
			'SELECT count(*) || '':'' || coalesce(sum(hashtextextended(x::text, 0)), 0) FROM %s AS x', t)
			INTO digest;
		RETURN NEXT;
	END LOOP;
END
$$
