-- Takes amount $2 from account $1 only if the balance covers it, and returns
-- the new balance; no row means "no such account" or "not enough money".
-- The row lock makes concurrent charges queue, and under READ COMMITTED the
-- WHERE clause is re-checked against the latest balance once the lock is
-- granted, so two charges can never both spend the same money.
UPDATE accounts
SET balance = balance - $2
WHERE id = $1 AND balance >= $2
RETURNING balance
