-- The happy path writes one row: a first claim and the worker's outcome of
-- that first attempt are no longer events of the trail, which readers
-- rebuild from the action row (created_at, completed_at) and the process
-- that claimed it, kept here.
ALTER TABLE {{.Table "action"}} ADD COLUMN origin TEXT NOT NULL DEFAULT '';
-- Where the first claim and the worker's outcome stand among the events
-- that were written: the last event id when each was recorded. Times are
-- milliseconds, and many events share one; the trail's readers order by
-- these what the clock cannot.
ALTER TABLE {{.Table "action"}} ADD COLUMN claim_seq INTEGER;
ALTER TABLE {{.Table "action"}} ADD COLUMN outcome_seq INTEGER;

-- Indexes only where a query needs one, and partial, so that a plain
-- action passes through as few as possible: each index is a b-tree whose
-- pages a commit writes to the WAL and syncs. A new key enters the primary
-- key, its run's and the due claims'; its outcome leaves the due claims
-- and enters the purge deadlines. The console's lists by status or kind
-- over the whole log read the table instead.
DROP INDEX IF EXISTS {{.Index "action_status"}};
DROP INDEX IF EXISTS {{.Index "action_kind"}};
DROP INDEX IF EXISTS {{.Index "action_released"}};
-- The review queue, released actions waiting for a delivery, unknown
-- outcomes: by status, newest or oldest first. The condition is written
-- with OR so that a query for one of the statuses (status = 'review')
-- is seen to imply it.
CREATE INDEX {{.Index "action_open"}} ON {{.Table "action"}} (status, updated_at)
    WHERE status = 'unknown' OR status = 'review' OR status = 'released';
-- A run's steps, for runs that have an id.
DROP INDEX IF EXISTS {{.Index "action_run"}};
CREATE INDEX {{.Index "action_run"}} ON {{.Table "action"}} (run_id, step) WHERE run_id <> '';
