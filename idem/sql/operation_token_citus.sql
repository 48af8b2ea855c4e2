-- operation_token_citus: a new fencing token for operation_begin_citus.sql
-- or operation_take_citus.sql, drawn on the node the call entered through.
-- Citus refuses volatile functions (nextval) in the UPDATE and the
-- DO UPDATE SET that take a token on the plain layout, so the token is
-- drawn here, in the first round trip of the owning transaction, and passed
-- in. Citus gives each node its own range of the sequence (a worker's
-- values start at its group id << 48), so tokens drawn through different
-- nodes never collide, and a token is never reused: an operation begun
-- again under a forgotten key never meets a stale owner's token.
SELECT nextval(pg_get_serial_sequence('idempotency_keys_operations', 'token'))
