-- Autovacuum's first analyze of a new table comes after its first fifty
-- rows by default, and its first vacuum after fifty dead ones. Plans
-- made on statistics of a log a few pages long scan it, which is
-- cheaper there than reading a key through the primary key; PostgreSQL
-- keeps such a plan, and every claim and outcome of the connection that
-- made it then scans the growing log until the next analyze. From a
-- thousand rows on, a plan reads the primary key. On a large log the
-- thresholds change nothing: the scale factors (a tenth, a fifth of the
-- rows) dominate them.
ALTER TABLE {{.Table "action"}} SET (autovacuum_analyze_threshold = 1000, autovacuum_vacuum_threshold = 1000);
