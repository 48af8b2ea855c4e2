-- assert_claimed_partitioned: assert_claimed.sql for the partitioned layout,
-- and the second look that keeps a live key unique across partitions.
--   $1 scope   $2 key
-- Fails (division by zero, SQLSTATE 22012) unless this transaction holds
-- the key as 'in_progress' AND no live row of the key exists. At READ
-- COMMITTED this statement has a snapshot of its own, taken after the claim
-- took the key's lock, so it sees any first attempt that committed before
-- that: a claim that finds one here lost the race and is undone (Do then
-- replays the live row). At SERIALIZABLE the snapshot is the claim's, and
-- serializable snapshot isolation turns the same race into a serialization
-- failure. At REPEATABLE READ nothing would catch it, so the statement
-- returns -1 and Do refuses the call (ErrInvalidOption). Otherwise it
-- returns 1 (0 if an 'in_progress' row committed by misuse is counted too).
--
-- The claimed row was inserted during this transaction: created_at >= now()
-- restricts the first count to partitions of the present.
SELECT CASE
    WHEN current_setting('transaction_isolation') = 'repeatable read' THEN -1
    ELSE 1 / ((
        SELECT count(*)
        FROM idempotency_keys
        WHERE scope = $1 AND idempotency_key = $2
          AND status = 'in_progress' AND created_at >= now()
    ) * (
        SELECT CASE WHEN EXISTS (
            SELECT 1
            FROM idempotency_keys
            WHERE scope = $1 AND idempotency_key = $2
              AND status <> 'in_progress'
              AND completed_at + (expires_at - created_at) > now()
        ) THEN 0 ELSE 1 END
    ))::int
END
