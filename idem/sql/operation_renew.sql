-- operation_renew: extends the leases of the owners at work on one Client's
-- operations (lease.go), all in one statement on the renewer's own
-- connection, so that no renewal waits for the pool the work uses.
--   $1 scopes   $2 keys   $3 tokens   $4 leases in microseconds (arrays of
--   one element per owner)
-- Returns the index (from 1) of each owner whose token is no longer its
-- operation's: another owner took it over, or it was forgotten. A row that
-- a transaction holds is skipped, not waited for: its owner's database
-- step holds it, running or pending (op_fence.sql and op_record.sql
-- renewed the lease, no takeover passes that lock, and a pending step
-- commits within a third of the lease, or its session ends within the
-- lease), or a takeover or Forget is deciding, and the next renewal
-- sees what it decided. A lease that has ended is not renewed: the owner
-- released it (op_release.sql) after this round had taken it, and a retry
-- must not wait a whole lease for an owner that stopped.
WITH want AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])
        WITH ORDINALITY AS w(scope, idempotency_key, token, micros, i)
),
held AS (
    SELECT o.scope, o.idempotency_key, w.micros
    FROM idempotency_keys_operations AS o
    JOIN want AS w USING (scope, idempotency_key, token)
    WHERE o.lease_until > clock_timestamp()
    FOR UPDATE OF o SKIP LOCKED
),
renewed AS (
    UPDATE idempotency_keys_operations AS o
    SET lease_until = clock_timestamp() + held.micros * interval '1 microsecond'
    FROM held
    WHERE o.scope = held.scope AND o.idempotency_key = held.idempotency_key
)
SELECT w.i
FROM want AS w
WHERE NOT EXISTS (
    SELECT 1 FROM idempotency_keys_operations AS o
    WHERE o.scope = w.scope AND o.idempotency_key = w.idempotency_key
      AND o.token = w.token)
