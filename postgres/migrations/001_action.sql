-- The action log: one row per intended effect, keyed by its intent.
CREATE TABLE {{.Table "action"}} (
    key          text        PRIMARY KEY,
    fingerprint  text        NOT NULL,
    run_id       text        NOT NULL,
    step         bigint      NOT NULL,
    kind         text        NOT NULL,
    target       text        NOT NULL,
    payload      bytea,
    status       text        NOT NULL CHECK (status IN ('in_flight', 'succeeded', 'failed', 'unknown', 'review', 'released')),
    attempt      integer     NOT NULL CHECK (attempt > 0),
    -- json, not jsonb: it keeps the result as written and accepts every
    -- string Go's encoder produces (jsonb refuses \u0000).
    result       json,
    error        text        NOT NULL DEFAULT '',
    lease_until  timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz
);

-- The reaper's query: in-flight claims by lease deadline.
CREATE INDEX {{.Index "action_lease"}} ON {{.Table "action"}} (lease_until) WHERE status = 'in_flight';
-- The console's and the CLI's: by status, by kind, newest first.
CREATE INDEX {{.Index "action_status"}} ON {{.Table "action"}} (status, updated_at DESC);
CREATE INDEX {{.Index "action_kind"}} ON {{.Table "action"}} (kind, updated_at DESC);
-- A run's steps, in order.
CREATE INDEX {{.Index "action_run"}} ON {{.Table "action"}} (run_id, step);
