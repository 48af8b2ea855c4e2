-- The example's own tables. Safe to apply more than once, and to a database
-- made by an earlier version: every change is also written as an idempotent
-- ALTER.

CREATE TABLE IF NOT EXISTS accounts (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner   text   NOT NULL CHECK (owner <> ''),
    -- Balances are in minor units (cents). The constraint is the last line of
    -- defence: the charge statement already refuses to overdraw.
    balance bigint NOT NULL,
    -- SHA-256 of the account's API key. The key itself is shown once, at
    -- sign-up, and never stored. Accounts made before API keys existed have
    -- none (NULL) and cannot be used through the API.
    api_key_sha256 bytea CHECK (octet_length(api_key_sha256) = 32),
    CONSTRAINT accounts_balance_check CHECK (balance >= 0)
);

-- Databases made before API keys existed.
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS api_key_sha256 bytea
    CHECK (octet_length(api_key_sha256) = 32);

-- Authentication looks an account up by its key's hash.
CREATE UNIQUE INDEX IF NOT EXISTS accounts_api_key_sha256_idx ON accounts (api_key_sha256);

CREATE TABLE IF NOT EXISTS payments (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id bigint      NOT NULL REFERENCES accounts (id),
    amount     bigint      NOT NULL CHECK (amount > 0),
    currency   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS payments_account_id_idx ON payments (account_id);

-- Settlement at the payment processor (package settlement): the processor's
-- charge, once it has charged the payment, and when that was recorded. A
-- charge settles one payment only.
ALTER TABLE payments ADD COLUMN IF NOT EXISTS processor_id text
    CHECK (octet_length(processor_id) BETWEEN 1 AND 255);
ALTER TABLE payments ADD COLUMN IF NOT EXISTS settled_at timestamptz;
CREATE UNIQUE INDEX IF NOT EXISTS payments_processor_id_idx ON payments (processor_id);
