-- sweep: deletes at most $1 expired keys. The index on expires_at (created_at
-- + TTL, a lower bound of the expiry) finds the candidates; a completed key
-- goes only once completed_at + TTL has passed too. SKIP LOCKED steps over
-- rows that a claim is replacing right now; each batch is its own short
-- transaction.
DELETE FROM idempotency_keys
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idempotency_keys
    WHERE expires_at <= now()
      AND (status = 'in_progress'
           OR completed_at + (expires_at - created_at) <= now())
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
))
