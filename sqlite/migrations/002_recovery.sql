-- Recovery: verifier failures, a person's resolution, and the trail.
ALTER TABLE {{.Table "action"}} ADD COLUMN verify_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{.Table "action"}} ADD COLUMN resolved_by TEXT NOT NULL DEFAULT '';
ALTER TABLE {{.Table "action"}} ADD COLUMN resolved_at INTEGER;
ALTER TABLE {{.Table "action"}} ADD COLUMN resolve_note TEXT NOT NULL DEFAULT '';

-- The reaper's query covers unknown outcomes as well as lapsed claims.
DROP INDEX IF EXISTS {{.Index "action_lease"}};
CREATE INDEX {{.Index "action_due"}} ON {{.Table "action"}} (lease_until) WHERE status IN ('in_flight', 'unknown');

-- One append-only trail per action; purging an action deletes its events.
CREATE TABLE {{.Table "event"}} (
    id          INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    key         TEXT    NOT NULL,
    at          INTEGER NOT NULL DEFAULT (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)),
    type        TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    from_status TEXT    NOT NULL DEFAULT '',
    to_status   TEXT    NOT NULL DEFAULT '',
    actor       TEXT    NOT NULL DEFAULT '',
    note        TEXT    NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX {{.Index "event_key"}} ON {{.Table "event"}} (key, id);
CREATE INDEX {{.Index "event_at"}} ON {{.Table "event"}} (at DESC);
