-- The action log: one row per intended effect, keyed by its intent. The
-- columns mean what they mean in the postgres store. Times are INTEGER
-- milliseconds since the Unix epoch, UTC, always read from the database's
-- clock, so they sort and compare as numbers in SQL. STRICT makes SQLite
-- refuse a value of the wrong type instead of storing it anyway.
CREATE TABLE {{.Table "action"}} (
    key          TEXT    NOT NULL PRIMARY KEY,
    fingerprint  TEXT    NOT NULL,
    run_id       TEXT    NOT NULL,
    step         INTEGER NOT NULL,
    kind         TEXT    NOT NULL,
    target       TEXT    NOT NULL,
    payload      BLOB,
    status       TEXT    NOT NULL CHECK (status IN ('in_flight', 'succeeded', 'failed', 'unknown', 'review', 'released')),
    attempt      INTEGER NOT NULL CHECK (attempt > 0),
    -- JSON text, kept as written; the check refuses what PostgreSQL's json
    -- type would refuse.
    result       TEXT    CHECK (result IS NULL OR json_valid(result)),
    error        TEXT    NOT NULL DEFAULT '',
    lease_until  INTEGER,
    created_at   INTEGER NOT NULL DEFAULT (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)),
    claimed_at   INTEGER NOT NULL DEFAULT (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)),
    updated_at   INTEGER NOT NULL DEFAULT (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)),
    completed_at INTEGER
) STRICT;

-- The reaper's query: in-flight claims by lease deadline.
CREATE INDEX {{.Index "action_lease"}} ON {{.Table "action"}} (lease_until) WHERE status = 'in_flight';
-- The console's and the CLI's: by status, by kind, newest first.
CREATE INDEX {{.Index "action_status"}} ON {{.Table "action"}} (status, updated_at DESC);
CREATE INDEX {{.Index "action_kind"}} ON {{.Table "action"}} (kind, updated_at DESC);
-- A run's steps, in order.
CREATE INDEX {{.Index "action_run"}} ON {{.Table "action"}} (run_id, step);
