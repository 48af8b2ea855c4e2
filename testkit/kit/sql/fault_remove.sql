-- fault_remove: drops what fault_install created.
SET LOCAL lock_timeout = '10s';
DROP TRIGGER IF EXISTS {{trigger}} ON {{table}};
DROP FUNCTION IF EXISTS {{function}}();
DROP TABLE IF EXISTS {{arm}};
