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
	-- An update completes a key only from 'in_progress'. (An upsert that
	-- replaces an expired row fires the INSERT trigger first.)
	IF TG_OP = 'UPDATE' AND OLD.status <> 'in_progress' THEN
		RETURN NEW;
	END IF;
	IF EXISTS (SELECT 1 FROM {{arm}} WHERE idempotency_key = NEW.idempotency_key) THEN
		RAISE EXCEPTION 'idem test kit: injected failure: the transaction of key % rolls back after its work ran', NEW.idempotency_key;
	END IF;
	RETURN NEW;
END
$$;

-- Only the write that completes a key fails: the completing update (from
-- 'in_progress', where the claim inserted the row) or the completing insert
-- (where the key's row is written once, completed, before COMMIT, or
-- replaces an expired row).
CREATE TRIGGER {{trigger}}
BEFORE INSERT OR UPDATE ON {{table}}
FOR EACH ROW
WHEN (NEW.status <> 'in_progress')
EXECUTE FUNCTION {{function}}();
