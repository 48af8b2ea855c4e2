-- claim_partitioned: claim.sql for the partitioned layout
-- (schema/partitioned), where the primary key is (scope, idempotency_key,
-- created_at) and no longer makes a live key unique on its own.
--   $1 scope   $2 key   $3 request hash   $4 time to live in microseconds
--   $5 the key's lock (lockKey in lockkey.go; the locks are claim.sql's)
-- Returns claim.sql's row plus the claimed row's created_at (null unless
-- claimed), which complete_partitioned.sql names the row by.
--
-- A live row in the snapshot is answered without locking or writing, as on
-- the plain table: a replay stays a pure read. Otherwise the key's advisory
-- lock is taken and a new row inserted; an expired row of the key stays
-- where it is (replacing it in place could move it to another partition) and
-- leaves with its partition.
--
-- Uniqueness across partitions rests on the lock, not on an index: a retry
-- whose row lands in another partition than the first attempt's conflicts
-- with nothing. Holding the lock, the claimer must see every committed row
-- of the key, but this statement's snapshot predates the lock: a first
-- attempt that committed (and so released the lock) between the two is
-- invisible here. assert_claimed_partitioned.sql, the next statement, looks
-- again with a snapshot taken after the lock (READ COMMITTED) and undoes the
-- claim if it finds a live row.
--
-- created_at is clock_timestamp() at insertion, not now(): the row enters
-- the partition of the moment it is written, never the partition of a long
-- transaction's start. That, and cur reading every partition (so that this
-- statement locks all of them before it computes created_at), is what lets
-- the sweeper close a partition: once it has held an ACCESS EXCLUSIVE lock
-- on a partition whose range has passed, no row can enter it again
-- (idem/sweep.go).
WITH cur AS (
    SELECT request_hash, status, response, refusal
    FROM idempotency_keys
    WHERE scope = $1 AND idempotency_key = $2
      AND status <> 'in_progress'
      AND completed_at + (expires_at - created_at) > now()
    ORDER BY created_at DESC
    LIMIT 1
),
lk AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM cur) THEN NULL
                WHEN pg_try_advisory_xact_lock($5::bigint # ('idempotency_keys'::regclass::oid::bigint << 32))
                     -- The table's counter for Stats, which excludes nobody.
                     AND pg_try_advisory_xact_lock_shared('idempotency_keys'::regclass::oid::int4, ($5::bigint & 1023)::int4)
                -- The marker the completing statement checks (complete.sql).
                THEN set_config('idem.locked', $1 || E'\x1f' || $2, true) IS NOT NULL
                ELSE false END AS locked
),
at AS MATERIALIZED (
    SELECT clock_timestamp() AS t
),
ins AS (
    INSERT INTO idempotency_keys
        (scope, idempotency_key, request_hash, status, response, refusal,
         created_at, completed_at, expires_at)
    SELECT $1, $2, $3, 'in_progress', NULL, NULL,
           at.t, NULL, at.t + $4::bigint * interval '1 microsecond'
    FROM lk, at
    WHERE lk.locked
    RETURNING created_at
)
SELECT (SELECT locked FROM lk),
       EXISTS (SELECT 1 FROM ins),
       cur.request_hash, cur.status, cur.response, cur.refusal,
       (SELECT created_at FROM ins)
FROM (SELECT 1) AS one
LEFT JOIN cur ON true
