INSERT INTO accounts (id, owner, balance, api_key_sha256)
VALUES ($1, $2, $3, $4)
RETURNING id, owner, balance
