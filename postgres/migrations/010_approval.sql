-- Approval gates: an action of a kind that asks for approval is written
-- awaiting_approval by its first claim, and a person's approval makes it
-- approved until a delivery claims it. on_expiry is what an unanswered
-- wait becomes when it expires (failed or review), recorded at the claim
-- so that any process's reaper applies it; empty for an action that
-- never waited. lease_until is, while it waits, when the wait expires.
--
-- The status check is replaced by a wider one. Every row meets it, since
-- every row met the narrower one: it is added NOT VALID, which skips
-- the scan of the whole log under the table's lock, and holds for every
-- row written from now on.
ALTER TABLE {{.Table "action"}} ADD COLUMN on_expiry text NOT NULL DEFAULT '';
ALTER TABLE {{.Table "action"}} DROP CONSTRAINT IF EXISTS {{.Constraint "action_status_check"}};
ALTER TABLE {{.Table "action"}} ADD CONSTRAINT {{.Constraint "action_status_check"}}
    CHECK (status IN ('in_flight', 'succeeded', 'failed', 'unknown', 'review', 'released', 'awaiting_approval', 'approved')) NOT VALID;
-- The open statuses' index gains the approval queue (the reaper's expiry
-- pass reads it there) and approved actions waiting for a delivery. No
-- index holds lease_until, so a heartbeat stays a HOT update
-- (TestHeartbeatIsHOT).
DROP INDEX IF EXISTS {{.QualifiedIndex "action_open"}};
CREATE INDEX {{.Index "action_open"}} ON {{.Table "action"}} (status, updated_at)
    WHERE status IN ('unknown', 'review', 'released', 'awaiting_approval', 'approved');
