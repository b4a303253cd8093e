-- The policy travels with the data: a row records its kind's recovery and
-- retention when it is claimed, and its own purge deadline when it
-- finishes, so every process that acts on it (a worker, a reaper, the
-- command) applies what the row says, whatever kinds it was told about.
ALTER TABLE {{.Table "action"}} ADD COLUMN recovery TEXT NOT NULL DEFAULT '';
ALTER TABLE {{.Table "action"}} ADD COLUMN retention_ms INTEGER;
ALTER TABLE {{.Table "action"}} ADD COLUMN retain_until INTEGER;
-- How long a released action waits for a delivery before it counts as
-- waiting, and whether the application re-drives it (has a hook).
ALTER TABLE {{.Table "action"}} ADD COLUMN redrive_after_ms INTEGER;
ALTER TABLE {{.Table "action"}} ADD COLUMN redrive INTEGER NOT NULL DEFAULT 0;

-- Rows finished before this migration keep the default retention.
UPDATE {{.Table "action"}} SET retain_until = coalesce(completed_at, updated_at) + 30 * 86400000
WHERE status IN ('succeeded', 'failed');

-- Purge's query: finished actions by their own deadline.
CREATE INDEX {{.Index "action_retain"}} ON {{.Table "action"}} (retain_until) WHERE retain_until IS NOT NULL;

-- Released actions waiting for a delivery, oldest first.
CREATE INDEX {{.Index "action_released"}} ON {{.Table "action"}} (updated_at) WHERE status = 'released';
