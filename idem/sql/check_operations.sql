-- check_operations: what Client.Check asks about the tables of unfinished
-- operations (schema/002), which Forget and Stats read on either layout
-- and operations write.
--   $1 the key table
-- Returns whether idempotency_keys_operations and idempotency_keys_steps
-- exist, whether the key table's status check admits 'unfinished' (true
-- when it has no such check), and whether the database has the Citus
-- extension (check_citus.sql then asks more).
SELECT to_regclass('idempotency_keys_operations') IS NOT NULL,
       to_regclass('idempotency_keys_steps') IS NOT NULL,
       NOT EXISTS (
           SELECT 1 FROM pg_constraint
           WHERE conrelid = to_regclass($1) AND conname = 'idempotency_keys_status_check'
             AND pg_get_constraintdef(oid) NOT LIKE '%unfinished%'),
       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
