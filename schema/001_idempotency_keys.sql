-- idem: the idempotency key table.
--
-- One row per (scope, idempotency_key), written in the same transaction as
-- the business work, so a committed row is terminal: 'completed', or
-- 'refused' (a stored business refusal). The one exception is an operation
-- made of steps (idem.Operation), whose row is committed 'unfinished' by its
-- first step and holds the key, for Do and the operation alike, until its
-- last step stores the answer; what only unfinished operations need lives in
-- idempotency_keys_operations and idempotency_keys_steps (002). Depending on the call (idem/tx.go),
-- the row is inserted 'in_progress' when the key is claimed and updated to
-- its outcome before that transaction commits, or inserted once, with its
-- outcome, before it commits. A row is replayed until completed_at plus its
-- time to live (expires_at - created_at) and deleted by the sweeper once
-- expires_at has passed too.
--
-- Safe to apply more than once.

CREATE TABLE IF NOT EXISTS idempotency_keys (
    -- scope isolates keys of different tenants, users or operations: the same
    -- key in two scopes is two unrelated rows.
    scope           text        NOT NULL DEFAULT '',
    idempotency_key text        NOT NULL,
    -- request_hash fingerprints the request (hex SHA-256 by convention); a
    -- retry with another fingerprint is refused as a mismatch.
    request_hash    text        NOT NULL,
    status          text        NOT NULL DEFAULT 'in_progress',
    -- response is the encoded result, possibly sealed (encrypted) by the
    -- application; refusal is the stored business refusal, if any.
    response        bytea,
    refusal         jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    expires_at      timestamptz NOT NULL,
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (scope, idempotency_key),
    CONSTRAINT idempotency_keys_status_check
        CHECK (status IN ('in_progress', 'completed', 'refused', 'unfinished')),
    CONSTRAINT idempotency_keys_key_length_check
        CHECK (octet_length(idempotency_key) BETWEEN 1 AND 255),
    CONSTRAINT idempotency_keys_scope_length_check
        CHECK (octet_length(scope) <= 255),
    CONSTRAINT idempotency_keys_request_hash_length_check
        CHECK (octet_length(request_hash) BETWEEN 1 AND 255)
)
-- Where a key is inserted 'in_progress' and then updated in the same
-- transaction (REPEATABLE READ, SERIALIZABLE, an outer transaction), the
-- update touches no indexed column, so with free space on the page it is a
-- HOT update: no new index entries, and the dead version is pruned in place.
-- A key written once (a pool or connection at READ COMMITTED, the default)
-- leaves no dead version; the free space then serves the other calls.
WITH (fillfactor = 80);

-- The sweeper deletes in expires_at order; this index keeps that cheap.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx
    ON idempotency_keys (expires_at);
