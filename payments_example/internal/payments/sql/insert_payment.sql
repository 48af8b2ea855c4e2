INSERT INTO payments (id, account_id, amount, currency)
VALUES ($1, $2, $3, $4)
