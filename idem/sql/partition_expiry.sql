-- partition_expiry: the sweeper's cheap first test of one partition (named
-- idempotency_keys here; the sweeper puts the partition's name in its
-- place). A key lives until completed_at + TTL, and completed_at is never
-- before created_at, so no key outlives max(expires_at): while that is in
-- the future the partition stays, without reading more than the end of its
-- expires_at index.
SELECT coalesce(max(expires_at) <= now(), true) FROM idempotency_keys
