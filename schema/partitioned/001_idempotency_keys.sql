-- idem: the key table, partitioned by created_at (opt-in layout).
--
-- The same columns as schema/001_idempotency_keys.sql, so idem.Do, Run, Wrap,
-- idemhttp and replays work unchanged on it. Expired keys leave by whole
-- partitions (Client.Sweep drops a partition once every key in it has expired)
-- instead of by DELETE. docs/SCALING.md and the schema package's
-- ApplyPartitioned describe the layout and its maintenance.
--
-- Why created_at: a key's partition is fixed when it is claimed and never
-- changes (expires_at may be moved by an operator; created_at is not), and a
-- partition of claims made in [a, b) only ever needs the partitions of the
-- present and the near future to exist: with a 24 h TTL and a 10 s interval,
-- partitioning by expires_at would need a day of partitions made ahead.
--
-- A unique index on a partitioned table must contain the partition key, so
-- the primary key is (scope, idempotency_key, created_at): on its own it no
-- longer makes a live key unique. idem's claim for this layout keeps it
-- unique under the key's advisory lock (idem/sql/claim_partitioned.sql).
--
-- This file makes the parent only: that is what pg_partman's create_parent
-- expects. 002_idempotency_keys_partitions.sql adds the DEFAULT partition
-- and the partitions of the present.
--
-- Safe to apply more than once.

CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope           text        NOT NULL DEFAULT '',
    idempotency_key text        NOT NULL,
    request_hash    text        NOT NULL,
    status          text        NOT NULL DEFAULT 'in_progress',
    response        bytea,
    refusal         jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    expires_at      timestamptz NOT NULL,
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (scope, idempotency_key, created_at),
    CONSTRAINT idempotency_keys_status_check
        CHECK (status IN ('in_progress', 'completed', 'refused')),
    CONSTRAINT idempotency_keys_key_length_check
        CHECK (octet_length(idempotency_key) BETWEEN 1 AND 255),
    CONSTRAINT idempotency_keys_scope_length_check
        CHECK (octet_length(scope) <= 255),
    CONSTRAINT idempotency_keys_request_hash_length_check
        CHECK (octet_length(request_hash) BETWEEN 1 AND 255)
) PARTITION BY RANGE (created_at);
-- (A partitioned table takes no fillfactor; each partition is made WITH
-- (fillfactor = 80), as the plain table is, so the completing update stays
-- HOT.)

-- On every partition: the sweeper's cheap first test of a partition (its
-- largest expires_at) and the DELETE of the DEFAULT partition use it.
-- CREATE INDEX IF NOT EXISTS would lock the table and every partition (SHARE)
-- before finding the index there, which on a busy table deadlocks with
-- claims; the catalog is asked first.
DO $idem$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'idempotency_keys'::regclass
          AND c.relname = 'idempotency_keys_expires_at_idx'
    ) THEN
        CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
    END IF;
END
$idem$;
