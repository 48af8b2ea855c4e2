SELECT id, owner, balance
FROM accounts
WHERE id = $1
