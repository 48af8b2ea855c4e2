-- fault_arm: makes the next completion of key $1 fail.
INSERT INTO {{arm}} (idempotency_key) VALUES ($1) ON CONFLICT DO NOTHING
