-- Credits amount $3 to account $2 and records the credit of event $1 in
-- the ledger, in one statement; no row means "no such account", and
-- nothing was written.
WITH credited AS (
    UPDATE accounts
    SET balance = balance + $3
    WHERE id = $2
    RETURNING id
)
INSERT INTO deposits (event_id, account_id, amount, currency)
SELECT $1, id, $3, $4 FROM credited
RETURNING id
