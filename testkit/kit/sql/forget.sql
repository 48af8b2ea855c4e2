-- forget: deletes the rows of the kits' keys, in any scope.
--   $1 keys (text[])
DELETE FROM idempotency_keys WHERE idempotency_key = ANY ($1::text[])
