-- The token of the last write that set one: a claim, a takeover, an
-- outcome, a resolution. A writer whose reply was lost reads the row back
-- and knows from it whether its write applied.
ALTER TABLE {{.Table "action"}} ADD COLUMN token TEXT NOT NULL DEFAULT '';
