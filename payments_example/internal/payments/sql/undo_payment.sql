-- Undoes payment $1 of account $2, whose charge the processor declined:
-- deletes the payment and gives its amount back to the account, in one
-- statement. A payment the processor charged is never undone.
WITH undone AS (
    DELETE FROM payments
    WHERE id = $1 AND account_id = $2 AND processor_id IS NULL
    RETURNING amount
)
UPDATE accounts
SET balance = balance + undone.amount
FROM undone
WHERE accounts.id = $2
