-- The example's own tables. Safe to apply more than once. A database made
-- by an earlier version, whose ids were sequential integers, is refused
-- (SQLSTATE 55000, Migrate's ErrOldSchema) before anything is changed:
-- its ids cannot become random ones in place without changing every
-- idempotency scope, and with them the keys that a retry would be
-- answered from.

DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema()
          AND table_name IN ('accounts', 'payments')
          AND column_name = 'id'
          AND data_type <> 'uuid'
    ) THEN
        RAISE EXCEPTION 'the accounts and payments tables have sequential ids, from an earlier version of the example'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'drop them (and their idempotency keys), or use another database';
    END IF;
END
$$;

CREATE TABLE IF NOT EXISTS accounts (
    -- A random UUID (version 4), made by the service: it reveals neither
    -- how many accounts there are nor when this one was opened.
    id      uuid   PRIMARY KEY,
    owner   text   NOT NULL CHECK (owner <> ''),
    -- Balances are in minor units (cents). The constraint is the last line of
    -- defence: the charge statement already refuses to overdraw.
    balance bigint NOT NULL,
    -- SHA-256 of the account's API key. The key itself is shown once, at
    -- sign-up, and never stored.
    api_key_sha256 bytea NOT NULL CHECK (octet_length(api_key_sha256) = 32),
    CONSTRAINT accounts_balance_check CHECK (balance >= 0)
);

-- Authentication looks an account up by its key's hash.
CREATE UNIQUE INDEX IF NOT EXISTS accounts_api_key_sha256_idx ON accounts (api_key_sha256);

CREATE TABLE IF NOT EXISTS payments (
    -- A random UUID (version 4), as accounts': the payment volume stays
    -- the service's own business.
    id         uuid        PRIMARY KEY,
    account_id uuid        NOT NULL REFERENCES accounts (id),
    amount     bigint      NOT NULL CHECK (amount > 0),
    currency   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Settlement at the payment processor (package settlement): the
    -- processor's charge, once it has charged the payment, and when that
    -- was recorded. A charge settles one payment only.
    processor_id text CHECK (octet_length(processor_id) BETWEEN 1 AND 255),
    settled_at   timestamptz
);

CREATE INDEX IF NOT EXISTS payments_account_id_idx ON payments (account_id);
CREATE UNIQUE INDEX IF NOT EXISTS payments_processor_id_idx ON payments (processor_id);
