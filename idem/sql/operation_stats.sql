-- operation_stats: the unfinished operations of a key table (Client.Stats): how
-- many, and the age of the oldest in microseconds. The table holds
-- unfinished operations only (op_complete.sql deletes each at its end).
SELECT count(*),
       coalesce((extract(epoch FROM clock_timestamp() - min(created_at)) * 1000000)::bigint, 0)
FROM idempotency_keys_operations
