-- partition_census: how many rows the partition holds and how many of them
-- still replay (the liveness rule of claim.sql). A full read of the
-- partition, run after partition_barrier.sql and only once
-- partition_expiry.sql has passed.
SELECT count(*),
       count(*) FILTER (WHERE status <> 'in_progress'
                          AND completed_at + (expires_at - created_at) > now())
FROM idempotency_keys
