-- The happy path writes one row: a first claim and the worker's outcome of
-- that first attempt are no longer events of the trail, which readers
-- rebuild from the action row (created_at, completed_at) and the process
-- that claimed it, kept here.
ALTER TABLE {{.Table "action"}} ADD COLUMN origin text NOT NULL DEFAULT '';

-- Indexes only where a query needs one, and partial, so that a finished
-- action is in as few as possible: a transition to succeeded writes an
-- entry only into the indexes whose condition the finished row meets
-- (the primary key, the purge deadline, a run's steps). A heartbeat
-- changes no indexed column (lease_until and hold_token are in none), so
-- it is a HOT update, given room on the page: fillfactor leaves it.
DROP INDEX IF EXISTS {{.QualifiedIndex "action_status"}};
DROP INDEX IF EXISTS {{.QualifiedIndex "action_kind"}};
DROP INDEX IF EXISTS {{.QualifiedIndex "action_released"}};
DROP INDEX IF EXISTS {{.QualifiedIndex "action_due"}};
-- The reaper's due set: the actions in flight or unknown, few whatever the
-- log's size; their lease is read from the rows.
CREATE INDEX {{.Index "action_active"}} ON {{.Table "action"}} (status, kind) WHERE status IN ('in_flight', 'unknown');
-- The review queue, released actions waiting for a delivery, unknown
-- outcomes: by status, newest or oldest first.
CREATE INDEX {{.Index "action_open"}} ON {{.Table "action"}} (status, updated_at) WHERE status IN ('unknown', 'review', 'released');
-- A run's steps, for runs that have an id.
DROP INDEX IF EXISTS {{.QualifiedIndex "action_run"}};
CREATE INDEX {{.Index "action_run"}} ON {{.Table "action"}} (run_id, step) WHERE run_id <> '';
ALTER TABLE {{.Table "action"}} SET (fillfactor = 85);
