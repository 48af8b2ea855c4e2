-- fault_install: a trigger on the key table that makes the completion of an
-- armed key fail, so that the transaction of a request or call with that key
-- rolls back after the work ran, as a crash before COMMIT would. A key is
-- armed by a row in the fault's own table; the trigger only reads it, so
-- arming and disarming happen outside the failing transaction.
--
-- {{table}} is the key table; {{arm}}, {{function}} and {{trigger}} are the
-- fault's own names, unique to one run of a kit.
SET LOCAL lock_timeout = '10s';

CREATE TABLE {{arm}} (idempotency_key text PRIMARY KEY);

CREATE FUNCTION {{function}}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM {{arm}} WHERE idempotency_key = NEW.idempotency_key) THEN
		RAISE EXCEPTION 'idem test kit: injected failure: the transaction of key % rolls back after its work ran', NEW.idempotency_key;
	END IF;
	RETURN NEW;
END
$$;

-- Only the completing update (in_progress to completed or refused) fails:
-- the claim's own update of an expired row is left alone.
CREATE TRIGGER {{trigger}}
BEFORE UPDATE ON {{table}}
FOR EACH ROW
WHEN (OLD.status = 'in_progress' AND NEW.status <> 'in_progress')
EXECUTE FUNCTION {{function}}();
