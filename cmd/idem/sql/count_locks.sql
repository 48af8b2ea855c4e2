-- count_locks: keys in progress right now, and how long the oldest holder's
-- transaction has run: idem's claim takes a shared advisory lock on (<the
-- table's oid>, <10 bits of the key's lock>), which pg_locks shows as an
-- advisory lock with classid = the table's oid and objsubid = 2 (see
-- idem/sql/claim.sql). The
-- age needs the privilege to
-- see other roles' sessions in pg_stat_activity (pg_read_all_stats).
--   $1 the key table
SELECT count(*), max(now() - a.xact_start)
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = to_regclass($1)::oid
