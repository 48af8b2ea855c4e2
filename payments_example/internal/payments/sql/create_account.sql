INSERT INTO accounts (owner, balance, api_key_sha256)
VALUES ($1, $2, $3)
RETURNING id, owner, balance
