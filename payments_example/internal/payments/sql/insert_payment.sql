INSERT INTO payments (account_id, amount, currency)
VALUES ($1, $2, $3)
RETURNING id
