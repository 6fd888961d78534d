-- The calls of one user or session (tokenfleet replay export sends them one after another): the
-- request's session_id, an opaque hash the gateway makes of the tenant and the client's user,
-- never the user's own id. Old rows: '' (no session; replayed at their recorded times).
ALTER TABLE requests
    ADD COLUMN IF NOT EXISTS session_id String DEFAULT '';
