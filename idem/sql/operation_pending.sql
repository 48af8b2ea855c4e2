-- operation_pending: the last statement of a database step before it is left
-- pending (operation_steps.go): its transaction stays open, holding the
-- operation's row, until what the owner does next commits it. From here on
-- the session's idle timeout is the lease, so that an owner paused with a
-- step pending holds the operation no longer than its lease: the server
-- ends the session, the step rolls back, and the operation can be taken
-- over.
--   $1 idle_in_transaction_session_timeout in milliseconds (the lease)
SELECT set_config('idle_in_transaction_session_timeout', $1::text, true)
