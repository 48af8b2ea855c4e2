-- count_rows: keys that replay and keys that await the sweeper, by the
-- liveness rule of idem/sql/claim.sql. Reads the whole table (every
-- partition). idempotency_keys stands for the table being reported on.
SELECT count(*) FILTER (WHERE status <> 'in_progress'
                          AND completed_at + (expires_at - created_at) > now()),
       count(*) FILTER (WHERE NOT (status <> 'in_progress'
                                   AND completed_at + (expires_at - created_at) > now()))
FROM idempotency_keys
