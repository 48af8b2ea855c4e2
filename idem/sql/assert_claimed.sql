-- assert_claimed: fails (division by zero, SQLSTATE 22012) unless this
-- transaction holds the key as 'in_progress'. Sent between the claim and
-- BEGIN in one pipeline: when the key was not claimed, the failure aborts the
-- implicit transaction before BEGIN runs, so the connection is idle again
-- without a ROLLBACK round trip.
--   $1 scope   $2 key
SELECT 1 / count(*)::int
FROM idempotency_keys
WHERE scope = $1 AND idempotency_key = $2 AND status = 'in_progress'
