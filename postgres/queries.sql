-- The PostgreSQL store's statements (storekit.LoadQueries): $T and $E
-- are the action and event tables, $C and $V their columns as the store
-- scans them, $QC and $QT the columns qualified by c and t, $S the
-- status as an expression no queue's partial index is defined over (so
-- a statement that names its key reads the primary key, whatever the
-- statistics make a queue's index look like:
-- TestOneKeyStatementsReadThePrimaryKey), $NOTIFY the notification of a
-- row's change, $ORIGIN the process that claimed action a. Parameters
-- are numbered, $1.

-- name: purge
-- The purge's statements; $DUE is which finished actions are due: past
-- their deadline (purge_due_where, read from action_retain, with the
-- unused $1 a one-time filter), or not updated for $1
-- (purge_older_where). Two statements, not one with a CASE: a generic
-- plan of the CASE could use no index and read the log.
WITH gone AS (
    DELETE FROM $T WHERE key IN (
        SELECT key FROM $T
        WHERE status IN ('succeeded', 'failed') AND $DUE
        LIMIT $2
        FOR UPDATE SKIP LOCKED)
    RETURNING key, waiters
), ev AS (
    DELETE FROM $E WHERE key IN (SELECT key FROM gone)
), n AS (
    SELECT $NOTIFY FROM gone WHERE waiters
)
SELECT count(*), (SELECT count(*) FROM n) FROM gone

-- name: purge_count
SELECT count(*) FROM $T WHERE status IN ('succeeded', 'failed') AND $DUE

-- name: purge_due_where
retain_until <= now() AND $1::bigint <= 0

-- name: purge_older_where
updated_at < now() - $1::float8 * interval '1 microsecond'

-- name: claims
-- The claim statement for many keys, one each (batch.go), as
-- the claim statement does it for one: standing rows read
-- first, by their primary key, and only the other keys inserted,
-- in the order of their keys; each row comes back with its
-- request's index, i. A key whose standing row was committed
-- after the statement's snapshot comes back not at all, and is
-- read again, as after the claim statement alone.
--
-- Every read of the action table names its keys (key =
-- ANY($1), here and in transitions), and a batch runs with
-- sequential scans off (batchSettingsSQL): whatever plan
-- PostgreSQL made and kept, also one made while the log was
-- small, a batch reads its keys' rows through the primary key,
-- and never the whole log (TestGroupCommitReadsByKeyAsTheLogGrows).
WITH b AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bytea[], $8::bigint[],
        $9::text[], $10::text[], $11::bigint[], $12::bigint[], $13::boolean[], $14::text[], $15::bigint[], $16::text[])
        WITH ORDINALITY AS b(key, fingerprint, run_id, step, kind, target, payload, lease_us, token, recovery, retention_us,
            redrive_after_us, redrive, origin, approval_us, on_expiry, i)
), standing AS (
    SELECT $QT, b.i FROM b JOIN $T t ON t.key = b.key AND t.key = ANY($1::text[])
), claimed AS (
    INSERT INTO $T (key, fingerprint, run_id, step, kind, target, payload, status, attempt, lease_until, token, recovery, retention_us,
        redrive_after_us, redrive, origin, on_expiry)
    SELECT key, fingerprint, run_id, step, kind, target, payload, CASE WHEN approval_us > 0 THEN 'awaiting_approval' ELSE 'in_flight' END, 1,
        statement_timestamp() + CASE WHEN approval_us > 0 THEN approval_us ELSE lease_us END::float8 * interval '1 microsecond',
        token, recovery, retention_us, redrive_after_us, redrive, origin, on_expiry
    FROM b WHERE NOT EXISTS (SELECT 1 FROM standing s WHERE s.i = b.i) ORDER BY i
    ON CONFLICT (key) DO NOTHING
    RETURNING $C
)
SELECT $C, false, statement_timestamp(), i FROM standing
UNION ALL
SELECT $QC, true, statement_timestamp(), b.i FROM claimed c JOIN b ON b.key = c.key

-- name: transitions
-- The transition statement for many keys, one each: every
-- request's compare-and-set, event and notification as the
-- statement alone makes them. $11 holds each request's From
-- statuses joined by commas. It returns the index, i, of each
-- request that applied.
WITH b AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::boolean[], $7::bigint[], $8::bigint[],
        $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $19::text[],
        $20::boolean[], $22::text[], $23::boolean[], $24::boolean[])
        WITH ORDINALITY AS b(key, attempt, to_status, result, error, new_attempt, lease_us, verify_failures,
            resolved_by, resolve_note, from_statuses, hold, ev_type, ev_from, actor, note, token, origin, waiting,
            fingerprint, unexpired, expired, i)
), u AS (
    UPDATE $T t SET status = b.to_status, result = b.result::json, error = b.error, updated_at = now(),
        attempt = t.attempt + CASE WHEN b.new_attempt THEN 1 ELSE 0 END,
        claimed_at = CASE WHEN b.new_attempt THEN now() ELSE t.claimed_at END,
        lease_until = CASE WHEN b.lease_us > 0 THEN now() + b.lease_us::float8 * interval '1 microsecond' END,
        completed_at = CASE WHEN b.to_status IN ('succeeded', 'failed') THEN now() END,
        retain_until = CASE WHEN b.to_status IN ('succeeded', 'failed')
            THEN now() + coalesce(t.retention_us, $18::bigint)::float8 * interval '1 microsecond' END,
        verify_failures = b.verify_failures,
        resolved_by = CASE WHEN b.resolved_by <> '' THEN b.resolved_by ELSE t.resolved_by END,
        resolved_at = CASE WHEN b.resolved_by <> '' THEN now() ELSE t.resolved_at END,
        resolve_note = CASE WHEN b.resolved_by <> '' THEN b.resolve_note ELSE t.resolve_note END,
        hold_token = NULL,
        token = CASE WHEN b.token <> '' THEN b.token ELSE t.token END
    FROM b
    WHERE t.key = b.key AND t.key = ANY($1::text[]) AND t.attempt = b.attempt AND t.status = ANY(string_to_array(b.from_statuses, ','))
      AND (b.hold = '' OR t.hold_token = b.hold)
      AND (NOT b.waiting OR t.updated_at < now() - coalesce(t.redrive_after_us, $21::bigint)::float8 * interval '1 microsecond')
      AND (b.fingerprint = '' OR t.fingerprint = b.fingerprint) AND (NOT b.unexpired OR t.lease_until > now())
      AND (NOT b.expired OR t.lease_until <= now())
    RETURNING b.i, t.key, t.attempt, t.status, t.waiters
), ev AS (
    INSERT INTO $E (key, type, attempt, from_status, to_status, actor, note, origin)
    SELECT u.key, b.ev_type, u.attempt, b.ev_from, u.status, b.actor, b.note, b.origin FROM u JOIN b ON b.i = u.i WHERE b.ev_type <> ''
), n AS (
    SELECT $NOTIFY FROM u WHERE waiters
)
SELECT i, (SELECT count(*) FROM n) FROM u

-- name: claim
-- One statement claims a new key; when the key is held it returns
-- the standing row instead, so a duplicate costs one round trip.
-- The standing row is read first, by its primary key, and a
-- duplicate goes no further: the insert has nothing to insert,
-- so a replay is one indexed read, with no speculative insertion,
-- no lock and nothing written (the insert's values are cast, as
-- the SELECT that carries them types nothing from the table). A
-- row committed after the statement's snapshot was taken is not
-- standing for it, and its insert meets the conflict: no row
-- comes back, and claimRest reads it again with a fresh snapshot
-- (TestClaimSeesARowCommittedAfterItsSnapshot).
-- A first claim writes no event: the row, with its origin, is
-- the trail's first entry (storekit.WithHappyPath). A kind that
-- asks for approval ($15, the wait in microseconds, positive)
-- writes the row awaiting approval, its lease_until when the wait
-- expires, and what expiry makes of it ($16).
WITH standing AS (
    SELECT $C FROM $T WHERE key = $1
), claimed AS (
    INSERT INTO $T (key, fingerprint, run_id, step, kind, target, payload, status, attempt, lease_until, token, recovery, retention_us,
        redrive_after_us, redrive, origin, on_expiry)
    SELECT $1::text, $2::text, $3::text, $4::bigint, $5::text, $6::text, $7::bytea,
        CASE WHEN $15::bigint > 0 THEN 'awaiting_approval' ELSE 'in_flight' END, 1,
        statement_timestamp() + CASE WHEN $15::bigint > 0 THEN $15::bigint ELSE $8::bigint END::float8 * interval '1 microsecond', $9::text, $10::text, $11::bigint, $12::bigint,
        $13::boolean, $14::text, $16::text
    WHERE NOT EXISTS (SELECT 1 FROM standing)
    ON CONFLICT (key) DO NOTHING
    RETURNING $C
)
SELECT $C, false, statement_timestamp() FROM standing
UNION ALL
SELECT $C, true, statement_timestamp() FROM claimed

-- name: claim_in_tx
-- Inside a caller's transaction (BindTx) the snapshot may be
-- older than the statement: in REPEATABLE READ or SERIALIZABLE
-- it is the transaction's first statement's. A standing row
-- read from it may have moved on since (in flight then,
-- succeeded now), and must not be answered as it stood. There
-- the insert goes first: it meets the newest row, and a row
-- that changed after the snapshot is a serialization failure,
-- which the caller retries (TestClaimInAnOlderSnapshot).
-- The time it reports, against which the standing row's lease
-- is read, and from which its own lease runs, is the
-- statement's, as in claim: in a transaction now() is when the
-- transaction began, and a lease that ran out since would look
-- live.
WITH claimed AS (
    INSERT INTO $T (key, fingerprint, run_id, step, kind, target, payload, status, attempt, lease_until, token, recovery, retention_us,
        redrive_after_us, redrive, origin, on_expiry)
    VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $15::bigint > 0 THEN 'awaiting_approval' ELSE 'in_flight' END, 1,
        statement_timestamp() + CASE WHEN $15::bigint > 0 THEN $15::bigint ELSE $8::bigint END::float8 * interval '1 microsecond', $9, $10, $11, $12, $13, $14, $16)
    ON CONFLICT (key) DO NOTHING
    RETURNING $C
)
SELECT $C, true, statement_timestamp() FROM claimed
UNION ALL
SELECT $C, false, statement_timestamp() FROM $T WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM claimed)

-- name: reclaim
-- A released action is claimed again as the next attempt, if the
-- payload is the same. A process that does not configure the kind
-- ($10) keeps the recovery the row recorded, and does not claim a
-- row that recorded one it may not take ($11, ClaimRequest.Refuse).
-- An approved action ($12 is the status the claim saw, released or
-- approved, and claims it from) is claimed again the same way: its
-- attempt before this one never ran, so nothing is refused.
WITH claimed AS (
    UPDATE $T SET status = 'in_flight', attempt = attempt + 1, lease_until = statement_timestamp() + $3::float8 * interval '1 microsecond',
        claimed_at = now(), updated_at = now(), completed_at = NULL, result = NULL, error = '', verify_failures = 0,
        hold_token = NULL, token = $4, recovery = CASE WHEN $10 AND coalesce(recovery, '') <> '' THEN recovery ELSE $5 END,
        retention_us = $6, retain_until = NULL, redrive_after_us = $7, redrive = $8, waiters = false
    WHERE key = $1 AND $S = $12::text AND fingerprint = $2 AND ($12::text = 'approved' OR NOT (coalesce(recovery, '') = ANY($11)))
    RETURNING $C
), ev AS (
    INSERT INTO $E (key, type, attempt, from_status, to_status, actor, origin)
    SELECT key, 'claimed', attempt, $12::text, 'in_flight', 'worker', $9 FROM claimed
)
SELECT $C, true, statement_timestamp() FROM claimed

-- name: select_row
-- The fallback when the row a claim conflicted with was committed
-- after the claim's snapshot was taken.
SELECT $C, false, statement_timestamp() FROM $T WHERE key = $1

-- name: heartbeat
UPDATE $T SET lease_until = now() + $3::float8 * interval '1 microsecond', hold_token = NULL
WHERE key = $1 AND attempt = $2 AND $S = 'in_flight'
RETURNING lease_until

-- name: transition
-- A fenced compare-and-set and its event, in one statement, and a
-- notification when someone waits for the row. A CTE that calls
-- a volatile function runs only when read: the final SELECT
-- reads it.
WITH u AS (
    UPDATE $T SET status = $3, result = $4, error = $5, updated_at = now(),
        attempt = attempt + CASE WHEN $6 THEN 1 ELSE 0 END,
        claimed_at = CASE WHEN $6 THEN now() ELSE claimed_at END,
        lease_until = CASE WHEN $7::bigint > 0 THEN now() + $7::float8 * interval '1 microsecond' END,
        completed_at = CASE WHEN $3 IN ('succeeded', 'failed') THEN now() END,
        retain_until = CASE WHEN $3 IN ('succeeded', 'failed')
            THEN now() + coalesce(retention_us, $18::bigint)::float8 * interval '1 microsecond' END,
        verify_failures = $8,
        resolved_by = CASE WHEN $9 <> '' THEN $9 ELSE resolved_by END,
        resolved_at = CASE WHEN $9 <> '' THEN now() ELSE resolved_at END,
        resolve_note = CASE WHEN $9 <> '' THEN $10 ELSE resolve_note END,
        hold_token = NULL,
        token = CASE WHEN $17 <> '' THEN $17 ELSE token END
    WHERE key = $1 AND attempt = $2 AND $S = ANY($11) AND ($12 = '' OR hold_token = $12)
      AND (NOT $20::boolean OR updated_at < now() - coalesce(redrive_after_us, $21::bigint)::float8 * interval '1 microsecond')
      AND ($22::text = '' OR fingerprint = $22) AND (NOT $23::boolean OR lease_until > now()) AND (NOT $24::boolean OR lease_until <= now())
    RETURNING key, attempt, status, waiters
), ev AS (
    INSERT INTO $E (key, type, attempt, from_status, to_status, actor, note, origin)
    SELECT key, $13, attempt, $14, status, $15, $16, $19 FROM u WHERE $13 <> ''
), n AS (
    SELECT $NOTIFY FROM u WHERE waiters
)
SELECT count(*), (SELECT count(*) FROM n) FROM u

-- name: recoverable
-- Takes a batch of due actions and holds them; SKIP LOCKED keeps
-- concurrent reapers on disjoint batches. $8 maps kinds to their
-- holds in microseconds (RecoverRequest.KindHolds); $2 holds the
-- others. $9 are the recoveries only the kinds $5, or all but $7
-- when $6, may take (once.Verifiable).
WITH due AS (
    SELECT key FROM $T
    WHERE status IN ('in_flight', 'unknown') AND lease_until <= now()
      AND ($4::timestamptz IS NULL OR lease_until <= $4)
      AND (NOT (recovery = ANY($9)) OR kind = ANY($5) OR ($6 AND NOT (kind = ANY($7))))
    ORDER BY lease_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE $T SET lease_until = now() + coalesce(($8::jsonb ->> kind)::float8, $2::float8) * interval '1 microsecond', hold_token = $3
WHERE key IN (SELECT key FROM due)
RETURNING $C, now()

-- name: recover_key
-- One key, for inline recovery: found by its primary key, so no
-- cached plan scans the due actions to find it. The UPDATE's own
-- row lock and re-check keep two recoverers from both taking it.
UPDATE $T SET lease_until = now() + coalesce(($7::jsonb ->> kind)::float8, $2::float8) * interval '1 microsecond', hold_token = $3
WHERE key = $1 AND $S IN ('in_flight', 'unknown') AND lease_until <= now()
  AND (NOT (recovery = ANY($8)) OR kind = ANY($4) OR ($5 AND NOT (kind = ANY($6))))
RETURNING $C, now()

-- name: append_event
INSERT INTO $E (key, type, attempt, from_status, to_status, actor, note, origin) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)

-- name: events
SELECT $V FROM $E WHERE key = $1 ORDER BY id

-- name: trail_info
-- What a page of a trail needs of the rest of it
-- (storekit.TrailInfo): $2 is the row's status, $3 its
-- completed_at. It reads the key's events through their index,
-- and keeps none of them.
SELECT count(*), coalesce(bool_or(attempt = 1 AND type = 'claimed'), false),
    coalesce((SELECT origin FROM $E c WHERE c.key = $1 AND c.attempt = 1 AND c.type = 'claimed' ORDER BY c.id LIMIT 1), ''),
    coalesce(bool_or(attempt = 1 AND type <> 'refused' AND to_status = $2::text), false),
    coalesce(min(id) FILTER (WHERE at > $3::timestamptz), 0)
FROM $E WHERE key = $1

-- name: events_after
SELECT $V FROM $E WHERE key = $1 AND id > $2 ORDER BY id LIMIT $3

-- name: events_before
SELECT $V FROM $E WHERE key = $1 AND id < $2 ORDER BY id DESC LIMIT $3

-- name: events_row
SELECT $C, origin FROM $T WHERE key = $1

-- name: lock_outcome
-- The worker's outcome of attempt 1, which the row describes and
-- the trail does not hold (storekit.WithHappyPath), written out
-- before a decision changes the row; nothing when the trail holds
-- an event that took the row where it stands.
SELECT 1 FROM $T WHERE key = $1 AND attempt = 1 AND status IN ('succeeded', 'failed') FOR NO KEY UPDATE

-- name: outcome
INSERT INTO $E (key, at, type, attempt, from_status, to_status, actor, note, origin)
SELECT key, completed_at, status, 1, 'in_flight', status, 'worker', '', $ORIGIN FROM $T a
WHERE key = $1 AND attempt = 1 AND status IN ('succeeded', 'failed') AND completed_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM $E e WHERE e.key = a.key AND e.attempt = 1 AND e.type <> 'refused' AND e.to_status = a.status)

-- name: recent
-- The trail's events of the given types, newest first, with the
-- happy path's that were not written (storekit.WithHappyPath) made
-- from the action rows: a first claim for a row whose trail does
-- not hold one, the worker's outcome of attempt 1 for a row that
-- stands there with no event that took it there. Asked only for
-- recoveries (the console), the derived branches are one-time
-- filtered away and read no row. Events at the same time (a
-- claim and its success in one transaction, DoTx) keep the
-- order they would have had written: the claim first, the
-- outcome after what was written, as in WithHappyPath.
SELECT $V FROM (
    SELECT $V, 1 AS ord FROM $E WHERE cardinality($1::text[]) = 0 OR type = ANY($1)
    UNION ALL
    SELECT 0, key, created_at, 'claimed', 1, '', CASE WHEN on_expiry <> '' THEN 'awaiting_approval' ELSE 'in_flight' END, 'worker', '', origin, 0
    FROM $T a
    WHERE (cardinality($1::text[]) = 0 OR 'claimed' = ANY($1))
      AND NOT EXISTS (SELECT 1 FROM $E e WHERE e.key = a.key AND e.attempt = 1 AND e.type = 'claimed')
    UNION ALL
    SELECT 0, key, completed_at, status, 1, 'in_flight', status, 'worker', '', $ORIGIN, 2 FROM $T a
    WHERE (cardinality($1::text[]) = 0 OR 'succeeded' = ANY($1) OR 'failed' = ANY($1))
      AND attempt = 1 AND status IN ('succeeded', 'failed') AND (cardinality($1::text[]) = 0 OR status = ANY($1))
      AND NOT EXISTS (SELECT 1 FROM $E e WHERE e.key = a.key AND e.attempt = 1 AND e.type <> 'refused' AND e.to_status = a.status)
) t ORDER BY at DESC, ord DESC, id DESC LIMIT $2

-- name: stats
-- Ordered by bytes, as Stats orders the two parts of a large
-- log's count, whatever the columns' collation.
SELECT kind, status, recovery, count(*) FROM $T GROUP BY kind, status, recovery
ORDER BY kind COLLATE "C", status COLLATE "C", recovery COLLATE "C"

-- name: open_stats
-- The open statuses' counts, each branch read through the
-- partial index whose condition it implies (action_active,
-- action_open), and the finished ones', which read the log
-- (stats.go).
SELECT kind, status, recovery, count(*) FROM (
    SELECT kind, status, recovery FROM $T WHERE status IN ('in_flight', 'unknown')
    UNION ALL
    SELECT kind, status, recovery FROM $T WHERE status IN ('review', 'released', 'awaiting_approval', 'approved')
) a GROUP BY kind, status, recovery

-- name: finished_stats
SELECT kind, status, recovery, count(*) FROM $T WHERE status IN ('succeeded', 'failed') GROUP BY kind, status, recovery

-- name: get
SELECT $C FROM $T WHERE key = $1

-- name: list
SELECT $C FROM $T

-- name: state
-- A waiter's poll: where the action stands, without its payload.
SELECT status, attempt FROM $T WHERE key = $1

-- name: await
-- A waiter marks the row, so its next transition notifies, and
-- learns whether the row still stands where it saw it. Marked
-- already (by another waiter): no write. Not marked: the update
-- takes the row lock, so a transition either committed first (the
-- update then matches nothing, and the waiter claims again) or
-- runs after it and sees the mark.
WITH cur AS (
    SELECT waiters FROM $T WHERE key = $1 AND $S = $2 AND attempt = $3
), u AS (
    UPDATE $T SET waiters = true WHERE key = $1 AND $S = $2 AND attempt = $3 AND NOT waiters
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM cur WHERE waiters) OR EXISTS (SELECT 1 FROM u)
