-- idem: distributes the key table and the tables of unfinished operations
-- (schema/001 and schema/002, applied first) over a Citus cluster, by scope,
-- colocated with the business table named in the setting idem.colocate_with
-- (schema.ApplyDistributed sets it; with psql:
--   PGOPTIONS='-c idem.colocate_with=accounts' psql -f ...).
-- That table must be distributed already, by the column that holds the
-- tenant a call's scope names (idem.ContextWithScope), of type text, so
-- that a key and the tenant's rows share a shard and a call is a
-- single-shard transaction. Without the setting the tables are
-- distributed by scope on their own, colocated with nothing.
--
-- Safe to apply more than once: a table already distributed is left as it
-- is (idem.Client.Check reports one colocated elsewhere).
DO $idem$
DECLARE
    with_table text := nullif(current_setting('idem.colocate_with', true), '');
    colocate   text := 'default';
    t          regclass;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'idem: the Citus extension is not installed in this database'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    IF with_table IS NOT NULL THEN
        colocate := to_regclass(with_table)::text;
        IF colocate IS NULL THEN
            RAISE EXCEPTION 'idem: the table % to colocate with does not exist', with_table
                USING ERRCODE = 'undefined_table';
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition
                       WHERE logicalrelid = colocate::regclass AND partmethod = 'h') THEN
            RAISE EXCEPTION 'idem: % is not a hash-distributed table: distribute it first (create_distributed_table)', colocate
                USING ERRCODE = 'wrong_object_type';
        END IF;
    END IF;
    FOREACH t IN ARRAY ARRAY['idempotency_keys'::regclass,
                             'idempotency_keys_operations'::regclass,
                             'idempotency_keys_steps'::regclass] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = t) THEN
            PERFORM create_distributed_table(t::text, 'scope', colocate_with => colocate);
        END IF;
    END LOOP;
END
$idem$;
