-- The account whose API key hashes to $1, if any. Accounts without a key
-- (NULL) never match.
SELECT id
FROM accounts
WHERE api_key_sha256 = $1
