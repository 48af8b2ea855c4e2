-- idem: the DEFAULT partition and the partitions of the present and the near
-- future, for the partitioned key table (001_idempotency_keys.sql).
--
-- The DEFAULT partition takes any row no other partition takes: a claim
-- never fails for want of a partition, even if no maintenance has run since
-- this file was applied. Rows that land there are deleted in batches by
-- Client.Sweep, as on the plain table.
--
-- Partitions cover [lo, lo + interval) on a grid of the interval counted from
-- the Unix epoch (midnight UTC for a day), named <table>_pYYYYMMDD_HHMISS
-- after lo in UTC. This file makes the one holding the present and the
-- three after it, skipping any range that overlaps an existing partition or
-- holds rows in the DEFAULT partition (PostgreSQL would refuse it). It is
-- also the maintenance step that Client.Sweep runs to keep partitions made
-- ahead; from cron, `psql -f` it every interval or more often.
--
-- The interval is read from the setting idem.partition_interval when it is
-- set (schema.ApplyPartitioned sets it; with psql:
--   PGOPTIONS='-c idem.partition_interval=1h' psql -f ...),
-- else taken from the newest partition, else one day. It must be a whole
-- number of seconds, at least one.
--
-- Safe to apply more than once. Making a partition takes an ACCESS EXCLUSIVE
-- lock on the table and scans the whole DEFAULT partition (PostgreSQL checks
-- that none of its rows belongs in the new range), so claims wait for that
-- scan. While the DEFAULT partition is larger than 64 MB, nothing is made
-- and a NOTICE says so: the table then works as the plain one does, the
-- sweeper deleting expired keys from the DEFAULT partition in batches. Set
-- idem.partition_force to on to make the partitions anyway, accepting the
-- wait (e.g. PGOPTIONS='-c idem.partition_force=on' psql -f ...).

DO $idem$
DECLARE
    parent  regclass := 'idempotency_keys'::regclass;
    nsp     name;
    rel     name;
    kind    "char";
    step    interval := nullif(current_setting('idem.partition_interval', true), '')::interval;
    secs    numeric;
    premake constant int := 3;
    dflt    regclass;
    newest  timestamptz;
    v_lo    timestamptz;
    v_hi    timestamptz;
    taken   boolean;
BEGIN
    SELECT n.nspname, c.relname, c.relkind INTO nsp, rel, kind
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = parent;
    IF kind <> 'p' THEN
        RAISE EXCEPTION 'idem: % exists and is not partitioned', parent
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'A plain key table cannot be turned into a partitioned one in place: create the partitioned table under another name (docs/SCALING.md).';
    END IF;

    -- The newest range partition (bounds as this session writes them).
    SELECT b[1]::timestamptz, b[2]::timestamptz INTO v_lo, newest
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
        '^FOR VALUES FROM \(''([^'']*)''\) TO \(''([^'']*)''\)$') AS b
    WHERE i.inhparent = parent AND b IS NOT NULL
    ORDER BY 2 DESC
    LIMIT 1;

    step := coalesce(step, newest - v_lo, interval '1 day');
    secs := extract(epoch FROM step);
    IF secs < 1 OR secs <> floor(secs) THEN
        RAISE EXCEPTION 'idem: partition interval %: want a whole number of seconds, at least one', step
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT c.oid::regclass INTO dflt
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT';
    IF dflt IS NULL THEN
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s DEFAULT WITH (fillfactor = 80)',
                       nsp, rel || '_default', parent);
        dflt := format('%I.%I', nsp, rel || '_default')::regclass;
    END IF;

    IF pg_relation_size(dflt) > 64 * 1024 * 1024
       AND coalesce(current_setting('idem.partition_force', true), '') <> 'on' THEN
        RAISE NOTICE 'idem: % holds % of rows; no partition is made while it is over 64 MB (see idem.partition_force)',
            dflt, pg_size_pretty(pg_relation_size(dflt));
        RETURN;
    END IF;

    v_lo := to_timestamp(floor(extract(epoch FROM now()) / secs) * secs);
    IF newest > v_lo THEN
        v_lo := newest; -- continue after the partitions already made
    END IF;
    WHILE v_lo < now() + premake * step LOOP
        v_hi := v_lo + step;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE created_at >= $1 AND created_at < $2)', dflt)
            INTO taken USING v_lo, v_hi;
        IF NOT taken AND NOT EXISTS (
            SELECT 1
            FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid
            CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                '^FOR VALUES FROM \(''([^'']*)''\) TO \(''([^'']*)''\)$') AS b
            WHERE i.inhparent = parent
              AND b[1]::timestamptz < v_hi AND b[2]::timestamptz > v_lo
        ) THEN
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L) WITH (fillfactor = 80)',
                           nsp, rel || '_p' || to_char(v_lo AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS'), parent, v_lo, v_hi);
        END IF;
        v_lo := v_hi;
    END LOOP;
END
$idem$;
