-- The SQLite store's statements (storekit.LoadQueries): $T and $E are
-- the action and event tables, $C and $V their columns as the store
-- scans them, $NOW the database's clock in milliseconds, $SEQ the last
-- event's id. $TRANSITION_SET, $KIND_HOLD, $PURGE_DUE and $PURGE_OLDER
-- are the fragments below, put in first. Parameters are numbered, ?1.

-- name: transition_set
-- The SET clause of a transition, whose WHERE clause matches its
-- statuses as a JSON array (?11) or, for one, as text.
UPDATE $T SET status = ?3, result = ?4, error = ?5, updated_at = $NOW,
    attempt = attempt + ?6,
    claimed_at = CASE WHEN ?6 THEN $NOW ELSE claimed_at END,
    lease_until = CASE WHEN ?7 > 0 THEN $NOW + ?7 END,
    completed_at = CASE WHEN ?3 IN ('succeeded', 'failed') THEN $NOW END,
    outcome_seq = CASE WHEN ?3 IN ('succeeded', 'failed') THEN $SEQ END,
    retain_until = CASE WHEN ?3 IN ('succeeded', 'failed') THEN $NOW + coalesce(retention_ms, ?14) END,
    verify_failures = ?8,
    resolved_by = CASE WHEN ?9 <> '' THEN ?9 ELSE resolved_by END,
    resolved_at = CASE WHEN ?9 <> '' THEN $NOW ELSE resolved_at END,
    resolve_note = CASE WHEN ?9 <> '' THEN ?10 ELSE resolve_note END,
    hold_token = NULL,
    token = CASE WHEN ?13 <> '' THEN ?13 ELSE token END

-- name: kind_hold
-- A taken action's hold in milliseconds: its kind's in the JSON object
-- ?8 (RecoverRequest.KindHolds), else ?2.
coalesce((SELECT h.value FROM json_each(?8) AS h WHERE h.key = kind), ?2)

-- name: purge_due_where
-- The finished actions a purge may delete: past their own deadline,
-- which the purge deadlines' index finds, or, when ?1 is positive (the
-- next fragment), not updated for ?1 milliseconds, which reads the
-- table. Two statements, not one with a CASE, which no index serves.
status IN ('succeeded', 'failed') AND retain_until <= $NOW

-- name: purge_older_where
status IN ('succeeded', 'failed') AND updated_at < $NOW - ?1

-- name: list
-- The head of Store.List, to which each call adds its own clause.
SELECT $C FROM $T

-- name: claim
-- A new key, in one statement that is its own transaction. A
-- first claim writes no event: the row, with its origin, is the
-- trail's first entry (storekit.WithHappyPath). DO NOTHING: a key
-- that stands is answered by selectRow, or claimed again by
-- reclaim, in a transaction of their own. It returns only the
-- time: the rest of the row is the request's (claimedRow). A kind
-- that asks for approval (?15, the wait in milliseconds, positive)
-- writes the row awaiting approval, its lease_until when the wait
-- expires, and what expiry makes of it (?16).
INSERT INTO $T (key, fingerprint, run_id, step, kind, target, payload, status, attempt, lease_until, token, recovery, retention_ms,
    redrive_after_ms, redrive, origin, claim_seq, on_expiry)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, CASE WHEN ?15 > 0 THEN 'awaiting_approval' ELSE 'in_flight' END, 1, $NOW + CASE WHEN ?15 > 0 THEN ?15 ELSE ?8 END, ?9, ?10, ?11,
    ?12, ?13, ?14, $SEQ, ?16)
ON CONFLICT (key) DO NOTHING
RETURNING created_at

-- name: reclaim
-- A released action is claimed again as the next attempt, if the
-- payload is the same. Its claim is an event of the trail. A process
-- that does not configure the kind (?9) keeps the recovery the row
-- recorded, and does not claim a row that recorded one it may not
-- take (?10, ClaimRequest.Refuse, a JSON array). ?11 is the status
-- it claims from: released, or approved, whose attempt before never
-- ran, so nothing is refused.
UPDATE $T SET status = 'in_flight', attempt = attempt + 1, lease_until = $NOW + ?3,
    claimed_at = $NOW, updated_at = $NOW, completed_at = NULL, result = NULL, error = '', verify_failures = 0,
    hold_token = NULL, token = ?4, recovery = CASE WHEN ?9 AND coalesce(recovery, '') <> '' THEN recovery ELSE ?5 END, retention_ms = ?6,
    retain_until = NULL, redrive_after_ms = ?7, redrive = ?8
WHERE key = ?1 AND status = ?11 AND fingerprint = ?2
  AND (?11 = 'approved' OR coalesce(recovery, '') NOT IN (SELECT value FROM json_each(?10)))
RETURNING $C, $NOW

-- name: select_row
SELECT $C, $NOW FROM $T WHERE key = ?1

-- name: heartbeat
UPDATE $T SET lease_until = $NOW + ?3, hold_token = NULL
WHERE key = ?1 AND attempt = ?2 AND status = 'in_flight'
RETURNING lease_until

-- name: transition
-- The statuses to match come as one JSON array, so the statement
-- text is the same whatever their number.
$TRANSITION_SET
WHERE key = ?1 AND attempt = ?2 AND status IN (SELECT value FROM json_each(?11)) AND (?12 = '' OR hold_token = ?12)
  AND (NOT ?15 OR updated_at < $NOW - coalesce(redrive_after_ms, ?16))
  AND (?17 = '' OR fingerprint = ?17) AND (NOT ?18 OR lease_until > $NOW) AND (NOT ?19 OR lease_until <= $NOW)
RETURNING attempt, status

-- name: outcome
-- The worker's outcome, and any transition from one status that
-- writes no event: the same, with one status to match and
-- nothing to return but the count.
$TRANSITION_SET
WHERE key = ?1 AND attempt = ?2 AND status = ?11 AND (?12 = '' OR hold_token = ?12)

-- name: backfill
-- Before a transition takes an action out of the worker's
-- outcome of attempt 1, which was never written (the row told
-- it), the outcome is written, with its time and its origin:
-- the row will tell it no more. The condition is the
-- transition's, so both apply or neither, and the trail's test
-- for a written outcome is storekit.WithHappyPath's, so a row
-- from before the happy path, whose outcome was written, gets no
-- second one.
INSERT INTO $E (key, at, type, attempt, from_status, to_status, actor, origin)
SELECT key, coalesce(completed_at, updated_at), status, 1, 'in_flight', status, 'worker', origin FROM $T a
WHERE key = ?1 AND attempt = ?2 AND attempt = 1 AND status IN ('succeeded', 'failed')
  AND status IN (SELECT value FROM json_each(?3)) AND (?4 = '' OR hold_token = ?4)
  AND NOT EXISTS (SELECT 1 FROM $E e WHERE e.key = a.key AND e.attempt = 1 AND e.type <> 'refused' AND e.to_status = a.status)

-- name: event
INSERT INTO $E (key, type, attempt, from_status, to_status, actor, note, origin) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)

-- name: get
SELECT $C FROM $T WHERE key = ?1

-- name: state
-- A waiter's poll: where the action stands, without its payload.
SELECT status, attempt FROM $T WHERE key = ?1

-- name: events_row
SELECT $C, origin FROM $T WHERE key = ?1

-- name: events
SELECT $V FROM $E WHERE key = ?1 ORDER BY id

-- name: trail_info
-- What a page of a trail needs of the rest of it
-- (storekit.TrailInfo): ?2 is the row's status, ?3 its
-- completed_at. Times are milliseconds, and an event written in the
-- millisecond the outcome was recorded is after it or before it:
-- the row's outcome_seq, the last event id when the outcome was
-- recorded, tells which (rows from before it was kept go by time)
-- (TestClient/RefusedResolutionsDoNotGrowTheTrail).
SELECT count(*), coalesce(max(attempt = 1 AND type = 'claimed'), 0),
    coalesce((SELECT origin FROM $E c WHERE c.key = ?1 AND c.attempt = 1 AND c.type = 'claimed' ORDER BY c.id LIMIT 1), ''),
    coalesce(max(attempt = 1 AND type <> 'refused' AND to_status = ?2), 0),
    coalesce(min(CASE WHEN coalesce(id > (SELECT outcome_seq FROM $T WHERE key = ?1), at > ?3) THEN id END), 0)
FROM $E WHERE key = ?1

-- name: events_after
SELECT $V FROM $E WHERE key = ?1 AND id > ?2 ORDER BY id LIMIT ?3

-- name: events_before
SELECT $V FROM $E WHERE key = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3

-- name: recent
-- The trail's events of the given types, newest first, with the
-- happy path's that were not written (storekit.WithHappyPath) made
-- from the action rows: a first claim for a row whose trail does
-- not hold one, the worker's outcome of attempt 1 for a row that
-- stands there with no event that took it there. Times are
-- milliseconds, and events often share one: pos, the last event
-- id when a made up one was recorded (claim_seq, outcome_seq),
-- orders them among the written ones, then a claim before its
-- outcome, then the actions' rows in the order they were made.
SELECT $V FROM (
    SELECT $V, id AS pos, 0 AS ord, 0 AS rid FROM $E WHERE json_array_length(?1) = 0 OR type IN (SELECT value FROM json_each(?1))
    UNION ALL
    SELECT 0, key, created_at, 'claimed', 1, '', CASE WHEN on_expiry <> '' THEN 'awaiting_approval' ELSE 'in_flight' END, 'worker', '', origin,
        coalesce(claim_seq, 0), 1, rowid FROM $T a
    WHERE (json_array_length(?1) = 0 OR 'claimed' IN (SELECT value FROM json_each(?1)))
      AND NOT EXISTS (SELECT 1 FROM $E e WHERE e.key = a.key AND e.attempt = 1 AND e.type = 'claimed')
    UNION ALL
    SELECT 0, key, completed_at, status, 1, 'in_flight', status, 'worker', '', origin, coalesce(outcome_seq, 0), 2, rowid FROM $T a
    WHERE attempt = 1 AND status IN ('succeeded', 'failed')
      AND (json_array_length(?1) = 0 OR status IN (SELECT value FROM json_each(?1)))
      AND NOT EXISTS (SELECT 1 FROM $E e WHERE e.key = a.key AND e.attempt = 1 AND e.type <> 'refused' AND e.to_status = a.status)
) ORDER BY at DESC, pos DESC, ord DESC, rid DESC LIMIT ?2

-- name: recoverable
-- Takes a batch of due actions and holds them, in one statement
-- under the database's write lock, so no two callers share one.
-- ?9 are the recoveries only the kinds ?5, or all but ?7 when ?6,
-- may take (once.Verifiable).
UPDATE $T SET lease_until = $NOW + $KIND_HOLD, hold_token = ?3
WHERE key IN (
    SELECT key FROM $T
    WHERE status IN ('in_flight', 'unknown') AND lease_until <= $NOW AND (?4 IS NULL OR lease_until <= ?4)
      AND (recovery NOT IN (SELECT value FROM json_each(?9)) OR kind IN (SELECT value FROM json_each(?5))
           OR (?6 AND kind NOT IN (SELECT value FROM json_each(?7))))
    ORDER BY lease_until
    LIMIT ?1)
RETURNING $C, $NOW

-- name: recover_key
-- One key, for inline recovery, by its primary key.
UPDATE $T SET lease_until = $NOW + $KIND_HOLD, hold_token = ?3
WHERE key = ?1 AND status IN ('in_flight', 'unknown') AND lease_until <= $NOW
  AND (recovery NOT IN (SELECT value FROM json_each(?9)) OR kind IN (SELECT value FROM json_each(?5))
       OR (?6 AND kind NOT IN (SELECT value FROM json_each(?7))))
RETURNING $C, $NOW

-- name: stats
SELECT kind, status, recovery, count(*) FROM $T GROUP BY kind, status, recovery ORDER BY kind, status, recovery

-- name: open_stats
-- The open statuses' counts, each branch read through the
-- partial index whose condition it implies (action_due,
-- action_open), and the finished ones', which read the log
-- (storekit.Counts). TestPlans holds the first's plan.
SELECT kind, status, recovery, count(*) FROM (
    SELECT kind, status, recovery FROM $T WHERE status IN ('in_flight', 'unknown')
    UNION ALL
    SELECT kind, status, recovery FROM $T WHERE status = 'review'
    UNION ALL
    SELECT kind, status, recovery FROM $T WHERE status = 'released'
    UNION ALL
    SELECT kind, status, recovery FROM $T WHERE status = 'awaiting_approval'
    UNION ALL
    SELECT kind, status, recovery FROM $T WHERE status = 'approved'
) a GROUP BY kind, status, recovery

-- name: finished_stats
SELECT kind, status, recovery, count(*) FROM $T WHERE status IN ('succeeded', 'failed') GROUP BY kind, status, recovery

-- name: estimate
-- How many rows the log has held at most: SQLite numbers a new
-- row one past the highest, so this reads one page, and errs only
-- high, after a purge.
SELECT coalesce(max(rowid), 0) FROM $T

-- name: purge_events
DELETE FROM $E WHERE key IN (SELECT value FROM json_each(?1))

-- name: purge_due
DELETE FROM $T WHERE key IN (SELECT key FROM $T WHERE $PURGE_DUE ORDER BY retain_until LIMIT ?1) RETURNING key

-- name: purge_older
DELETE FROM $T WHERE key IN (SELECT key FROM $T WHERE $PURGE_OLDER ORDER BY key LIMIT ?2) RETURNING key

-- name: count_due
SELECT count(*) FROM $T WHERE $PURGE_DUE

-- name: count_older
SELECT count(*) FROM $T WHERE $PURGE_OLDER

-- name: now
SELECT $NOW
