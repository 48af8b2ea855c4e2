-- insert_citus: the second statement of the claim on a Citus cluster: the
-- key's row 'in_progress', in the call's transaction, on the key's shard.
--   $1 scope   $2 key   $3 request hash   $4 time to live in microseconds
-- Inserts one row when the key is claimed, none when a live row of the key
-- exists (a replay, or a first attempt that committed between the claim's
-- snapshot and its lock: the call then looks the row up and replays it).
--
-- The primary key (scope, idempotency_key) of the shard is what excludes a
-- duplicate whatever happened to the lock: a second insertion of the key
-- waits on this uncommitted row and then finds it live. An expired row, or
-- an 'in_progress' row committed by misuse, is replaced in place.
--
-- Citus evaluates the functions of an INSERT on the node the call entered
-- through, before it routes the row, and accepts only IMMUTABLE ones in the
-- ON CONFLICT clause: created_at is that node's now(), and the liveness
-- test compares intervals (timestamptz - timestamptz is IMMUTABLE,
-- timestamptz + interval is not) against excluded.created_at.
INSERT INTO idempotency_keys AS k
    (scope, idempotency_key, request_hash, status, response, refusal,
     created_at, completed_at, expires_at)
VALUES ($1, $2, $3, 'in_progress', NULL, NULL,
        now(), NULL, now() + $4::bigint * interval '1 microsecond')
ON CONFLICT (scope, idempotency_key) DO UPDATE
    SET request_hash = excluded.request_hash,
        status       = 'in_progress',
        response     = NULL,
        refusal      = NULL,
        created_at   = excluded.created_at,
        completed_at = NULL,
        expires_at   = excluded.expires_at
    WHERE k.status = 'in_progress'
       OR excluded.created_at - k.completed_at >= k.expires_at - k.created_at
