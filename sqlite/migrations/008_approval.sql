-- Approval gates: an action of a kind that asks for approval is written
-- awaiting_approval by its first claim, and a person's approval makes it
-- approved until a delivery claims it. on_expiry is what an unanswered
-- wait becomes when it expires (failed or review), recorded at the claim
-- so that any process's reaper applies it; empty for an action that
-- never waited. lease_until is, while it waits, when the wait expires.
--
-- SQLite cannot change a column's check in place, so the table is made
-- again with the wider status check, as SQLite's documentation of ALTER
-- TABLE describes, in the migration's transaction: the rows are copied
-- with their rowids (the trail orders a moment's events by them), the
-- old table dropped and the new one renamed. It rewrites the whole log
-- once.
CREATE TABLE {{.Table "action_008"}} (
    key              TEXT    NOT NULL PRIMARY KEY,
    fingerprint      TEXT    NOT NULL,
    run_id           TEXT    NOT NULL,
    step             INTEGER NOT NULL,
    kind             TEXT    NOT NULL,
    target           TEXT    NOT NULL,
    payload          BLOB,
    status           TEXT    NOT NULL CHECK (status IN ('in_flight', 'succeeded', 'failed', 'unknown', 'review', 'released',
                                                        'awaiting_approval', 'approved')),
    attempt          INTEGER NOT NULL CHECK (attempt > 0),
    result           TEXT    CHECK (result IS NULL OR json_valid(result)),
    error            TEXT    NOT NULL DEFAULT '',
    lease_until      INTEGER,
    created_at       INTEGER NOT NULL DEFAULT (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)),
    claimed_at       INTEGER NOT NULL DEFAULT (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)),
    updated_at       INTEGER NOT NULL DEFAULT (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)),
    completed_at     INTEGER,
    verify_failures  INTEGER NOT NULL DEFAULT 0,
    resolved_by      TEXT    NOT NULL DEFAULT '',
    resolved_at      INTEGER,
    resolve_note     TEXT    NOT NULL DEFAULT '',
    hold_token       TEXT,
    token            TEXT    NOT NULL DEFAULT '',
    recovery         TEXT    NOT NULL DEFAULT '',
    retention_ms     INTEGER,
    retain_until     INTEGER,
    redrive_after_ms INTEGER,
    redrive          INTEGER NOT NULL DEFAULT 0,
    origin           TEXT    NOT NULL DEFAULT '',
    claim_seq        INTEGER,
    outcome_seq      INTEGER,
    on_expiry        TEXT    NOT NULL DEFAULT ''
) STRICT;
INSERT INTO {{.Table "action_008"}} (rowid, key, fingerprint, run_id, step, kind, target, payload, status, attempt, result, error,
    lease_until, created_at, claimed_at, updated_at, completed_at, verify_failures, resolved_by, resolved_at, resolve_note,
    hold_token, token, recovery, retention_ms, retain_until, redrive_after_ms, redrive, origin, claim_seq, outcome_seq)
SELECT rowid, key, fingerprint, run_id, step, kind, target, payload, status, attempt, result, error,
    lease_until, created_at, claimed_at, updated_at, completed_at, verify_failures, resolved_by, resolved_at, resolve_note,
    hold_token, token, recovery, retention_ms, retain_until, redrive_after_ms, redrive, origin, claim_seq, outcome_seq
FROM {{.Table "action"}} ORDER BY rowid;
DROP TABLE {{.Table "action"}};
ALTER TABLE {{.Table "action_008"}} RENAME TO {{.Table "action"}};
CREATE INDEX {{.Index "action_due"}} ON {{.Table "action"}} (lease_until) WHERE status IN ('in_flight', 'unknown');
CREATE INDEX {{.Index "action_retain"}} ON {{.Table "action"}} (retain_until) WHERE retain_until IS NOT NULL;
CREATE INDEX {{.Index "action_run"}} ON {{.Table "action"}} (run_id, step) WHERE run_id <> '';
-- The open statuses: by status, newest or oldest first, written with OR
-- so that a query for one of them (status = 'review') is seen to imply
-- it. It holds the approval queue and approved actions waiting for a
-- delivery too.
CREATE INDEX {{.Index "action_open"}} ON {{.Table "action"}} (status, updated_at)
    WHERE status = 'unknown' OR status = 'review' OR status = 'released' OR status = 'awaiting_approval' OR status = 'approved';
-- The reaper's expiry pass: waits by when they expire.
CREATE INDEX {{.Index "action_expiry"}} ON {{.Table "action"}} (lease_until) WHERE status = 'awaiting_approval';
