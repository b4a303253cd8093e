-- Set while a process waits for the action's outcome (once.WaitFor): a
-- transition of a row that has it sends a notification the waiter
-- listens for. Rows nobody waits for send none, so their commits do not
-- queue on PostgreSQL's lock for notifying transactions. A new attempt's
-- claim clears it.
ALTER TABLE {{.Table "action"}} ADD COLUMN waiters boolean NOT NULL DEFAULT false;
