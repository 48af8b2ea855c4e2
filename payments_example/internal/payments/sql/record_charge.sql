-- Records charge $2 of the processor as payment $1's, for POST /charges's
-- last step. A payment is charged once: one that already holds a charge is
-- left alone, and the caller, seeing no row changed, fails rather than
-- answer a charge the payment does not hold.
UPDATE payments
SET processor_id = $2,
    settled_at   = now()
WHERE id = $1 AND processor_id IS NULL
