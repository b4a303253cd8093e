-- Recovery: verifier failures, a person's resolution, and the trail.
ALTER TABLE {{.Table "action"}}
    ADD COLUMN verify_failures integer     NOT NULL DEFAULT 0,
    ADD COLUMN resolved_by     text        NOT NULL DEFAULT '',
    ADD COLUMN resolved_at     timestamptz,
    ADD COLUMN resolve_note    text        NOT NULL DEFAULT '';

-- The reaper's query covers unknown outcomes as well as lapsed claims.
DROP INDEX IF EXISTS {{.QualifiedIndex "action_lease"}};
CREATE INDEX {{.Index "action_due"}} ON {{.Table "action"}} (lease_until) WHERE status IN ('in_flight', 'unknown');

-- One append-only trail per action. No foreign key: purging an action
-- deletes its events explicitly, and a refused late outcome may name an
-- action that no longer exists.
CREATE TABLE {{.Table "event"}} (
    id        bigserial   PRIMARY KEY,
    key       text        NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    type      text        NOT NULL,
    attempt   integer     NOT NULL,
    from_status text      NOT NULL DEFAULT '',
    to_status text        NOT NULL DEFAULT '',
    actor     text        NOT NULL DEFAULT '',
    note      text        NOT NULL DEFAULT ''
);
CREATE INDEX {{.Index "event_key"}} ON {{.Table "event"}} (key, id);
-- Recent recoveries for the console.
CREATE INDEX {{.Index "event_at"}} ON {{.Table "event"}} (at DESC);
