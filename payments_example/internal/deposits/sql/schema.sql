-- The ledger of the deposits credited to accounts (package deposits). Safe
-- to apply more than once; the accounts table must exist (payments.Migrate).
CREATE TABLE IF NOT EXISTS deposits (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The producer's id of the deposit event (its Nats-Msg-Id). Not
    -- unique, on purpose: the event's idempotency key, which commits in
    -- the credit's transaction, is what keeps a deposit from being
    -- credited twice, and a duplicate it let through would show here.
    event_id    text        NOT NULL CHECK (event_id <> ''),
    account_id  uuid        NOT NULL REFERENCES accounts (id),
    amount      bigint      NOT NULL CHECK (amount > 0),
    currency    text        NOT NULL,
    credited_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS deposits_account_id_idx ON deposits (account_id);
