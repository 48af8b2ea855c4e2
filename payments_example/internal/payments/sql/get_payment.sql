-- Payment $1 if it belongs to account $2: another account's payment is
-- not found, exactly as a missing one.
SELECT id, account_id, amount, processor_id
FROM payments
WHERE id = $1 AND account_id = $2
