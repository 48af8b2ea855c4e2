-- Records charge $2 of the processor as payment $1's settlement and returns
-- the charge recorded for the payment: $2, or the one an earlier run
-- recorded. Running it again with the same charge changes nothing, and a
-- recorded charge is never overwritten (the caller compares).
UPDATE payments
SET processor_id = coalesce(processor_id, $2),
    settled_at   = coalesce(settled_at, now())
WHERE id = $1
RETURNING processor_id
