-- Which process wrote each event (host:pid by default, Config.Origin),
-- so an operator can tell which machine claimed, recovered or decided.
ALTER TABLE {{.Table "event"}} ADD COLUMN origin TEXT NOT NULL DEFAULT '';
