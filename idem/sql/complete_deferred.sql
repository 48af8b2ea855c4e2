-- complete_deferred: writes the key's row, completed, in the round trip that
-- carries COMMIT: the deferred protocol's only write to the key table. The
-- key had no row when the claim looked (claim_deferred.sql), and its lock
-- kept every other call of the key out since, so a unique violation here
-- (SQLSTATE 23505) means a row of the key was written outside the protocol,
-- by fn itself, say: the transaction aborts before COMMIT and Do reports
-- ErrKeyLost.
--   $1 scope   $2 key   $3 request hash   $4 status ('completed' or
--   'refused')   $5 response   $6 refusal   $7 time to live in microseconds
--
-- created_at is now(), the transaction's start, as claim.sql writes it;
-- completed_at is the clock at completion, from which the TTL counts.
INSERT INTO idempotency_keys
    (scope, idempotency_key, request_hash, status, response, refusal,
     created_at, completed_at, expires_at)
SELECT $1, $2, $3, $4, $5, $6,
       now(), clock_timestamp(), now() + $7::bigint * interval '1 microsecond'
WHERE CAST(CASE WHEN current_setting('idem.locked', true) = $1 || E'\x1f' || $2
            THEN '1' ELSE 'idem: the transaction that claimed the key has ended' END AS int) = 1
