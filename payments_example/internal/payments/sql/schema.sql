-- The example's own tables. Safe to apply more than once.

CREATE TABLE IF NOT EXISTS accounts (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner   text   NOT NULL CHECK (owner <> ''),
    -- Balances are in minor units (cents). The constraint is the last line of
    -- defence: the charge statement already refuses to overdraw.
    balance bigint NOT NULL,
    CONSTRAINT accounts_balance_check CHECK (balance >= 0)
);

CREATE TABLE IF NOT EXISTS payments (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id bigint      NOT NULL REFERENCES accounts (id),
    amount     bigint      NOT NULL CHECK (amount > 0),
    currency   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS payments_account_id_idx ON payments (account_id);
