-- A recoverer's hold on an action: a random token, so a decision applies
-- only while the hold is still the recoverer's own. A heartbeat, a claim
-- and every applied transition clear it.
ALTER TABLE {{.Table "action"}} ADD COLUMN hold_token text;
