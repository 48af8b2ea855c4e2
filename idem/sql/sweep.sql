-- sweep: deletes at most $1 expired keys. SKIP LOCKED steps over rows that a
-- claim is replacing right now; each batch is its own short transaction.
DELETE FROM idempotency_keys
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idempotency_keys
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
))
