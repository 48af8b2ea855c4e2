-- assert_deferred: the second look of the deferred protocol, sent right
-- after claim_deferred.sql in the same pipeline and before BEGIN.
--   $1 scope   $2 key   $3 Config.IdleTimeout in milliseconds, or null
-- On a claim it also sets $3 as idle_in_transaction_session_timeout for the
-- rest of the transaction (is_local, like SET LOCAL), which BEGIN then makes
-- explicit: one statement fewer in the pipeline than a set_config of its
-- own. A failed assertion never sets it.
-- Fails (division by zero, SQLSTATE 22012) unless the claim took the key's
-- lock (claim_deferred.sql records that in the transaction-local setting
-- idem.locked) and no live row of the key exists. At READ COMMITTED this
-- statement takes a snapshot of its own, after the claim took the lock, so
-- it sees every first attempt that committed before the lock was granted
-- (PostgreSQL makes a commit visible before it releases the committer's
-- locks). The failure aborts the implicit transaction before BEGIN runs, so
-- a replay, a key in progress and a lost race all leave the connection idle
-- after one round trip, with nothing written and no lock kept.
--
-- Otherwise it returns:
--   1   the key is claimed, and has no row: complete_deferred.sql inserts it;
--   2   the key is claimed, and has a row that is not live (expired, or
--       'in_progress' committed by misuse), seen from this snapshot, after
--       the lock: complete_deferred_replace.sql replaces it;
--  -1   the transaction is not READ COMMITTED (READ UNCOMMITTED is READ
--       COMMITTED in PostgreSQL), although the protocol was chosen for it
--       (tx.go): the session's default changed since idem learnt it, or
--       something between idem and PostgreSQL dropped the SET statements.
--       At REPEATABLE READ or SERIALIZABLE the snapshot is the claim's and
--       would not see that first attempt: Do rolls back and fails the call,
--       and the next call learns the default again;
--  -2   the key's row could not be written at the end: a read-only
--       transaction (a standby, or default_transaction_read_only) or no
--       INSERT privilege on the table. Do rolls back before fn runs, as
--       claim.sql's insertion would have failed before it.
-- A replay never reaches these checks: it can be answered by a standby.
SELECT 1 / (CASE WHEN current_setting('idem.locked', true) = $1 || E'\x1f' || $2
                 THEN 1 ELSE 0 END)
     * CASE
        WHEN current_setting('transaction_isolation')
             NOT IN ('read committed', 'read uncommitted') THEN -1
        WHEN current_setting('transaction_read_only') = 'on'
             OR NOT has_table_privilege('idempotency_keys'::regclass, 'INSERT') THEN -2
        -- The primary key makes this at most one row: a scalar subquery,
        -- where an aggregate would cost the executor more to start.
        ELSE coalesce((
            SELECT 2 / (CASE WHEN status = 'unfinished'
                              OR status <> 'in_progress'
                                 AND completed_at + (expires_at - created_at) > now()
                             THEN 0 ELSE 1 END)
            FROM idempotency_keys
            WHERE scope = $1 AND idempotency_key = $2
        ), 1) * (CASE WHEN $3::text IS NULL THEN 1
                  ELSE 1 + 0 * length(set_config('idle_in_transaction_session_timeout', $3::text, true))
             END)
    END
