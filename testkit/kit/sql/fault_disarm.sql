-- fault_disarm: lets key $1 complete again.
DELETE FROM {{arm}} WHERE idempotency_key = $1
