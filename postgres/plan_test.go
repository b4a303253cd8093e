package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/storekit"
)

// Inline recovery of one key must find it by its primary key, whatever
// plan PostgreSQL caches: a statement shared with the batch query (key =
// $1 OR $1 = ”) gets a generic plan that scans every due action to
// recover one. Checked on the plan PostgreSQL really executes, with
// generic plans forced and 20,000 actions due.
func TestRecoverOneKeyUsesThePrimaryKey(t *testing.T) {
	ctx := context.Background()
	conn, s := planStore(t)
	table := s.names.Table("action")
	if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, lease_until)
SELECT md5(g::text), '', 'r', g, 'k', '', 'in_flight', 1, now() - interval '1 hour' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Prepare(ctx, "recover_one", s.q.recoverKey); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, FORMAT TEXT) EXECUTE recover_one('`+strings.Repeat("0", 32)+`', 60000000, 'tok', '{}', false, '{}', '{}', '{verify_then_decide}')`)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "_pkey") || strings.Contains(text, "Seq Scan") || strings.Contains(text, "action_active") {
		t.Fatalf("recovering one key scans the due actions:\n%s", text)
	}
}

// TestQueuesUseTheirIndexes: with a large log of finished actions, the
// reaper's batch query, the operator's queues (review, released
// actions waiting for a delivery) and the purge by deadline read their
// indexes, not the log, under generic plans as under custom ones.
func TestQueuesUseTheirIndexes(t *testing.T) {
	ctx := context.Background()
	conn, s := planStore(t)
	table := s.names.Table("action")
	if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, completed_at, retain_until, updated_at)
SELECT md5(g::text), '', 'r', g, 'k', '', 'succeeded', 1, now(), now() + interval '30 days', now() - g * interval '1 second' FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, lease_until)
SELECT md5('o' || g::text), '', 'r', g, 'k', '', (ARRAY['in_flight', 'unknown', 'review', 'released'])[g % 4 + 1], 1,
    CASE WHEN g % 4 < 2 THEN now() - interval '1 minute' END FROM generate_series(1, 40) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	review, args := storekit.ListClause(once.Filter{Status: once.StatusReview, Limit: 50}, listDialect)
	waiting, wargs := storekit.ListClause(once.Filter{Waiting: true, OldestFirst: true, Limit: 50}, listDialect)
	for _, c := range []struct {
		name, sql, index string
		args             []any
	}{
		{"the reaper's batch", s.q.recoverable, "action_active", []any{100, int64(60000000), "tok", nil, []string{}, false, []string{}, "{}", []string{"verify_then_decide"}}},
		{"the review queue", s.q.list + review, "action_open", args},
		{"released actions waiting", s.q.list + waiting, "action_open", wargs},
		{"the purge by deadline", s.q.purge, "action_retain", []any{int64(0), 100}},
		{"the purge's dry run", s.q.purgeCount, "action_retain", []any{int64(0)}},
	} {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			plan := explain(t, conn, mode, c.sql, c.args...)
			if !strings.Contains(plan, c.index) || strings.Contains(plan, "Seq Scan") {
				t.Errorf("%s (%s) does not read %s:\n%s", c.name, mode, c.index, plan)
			}
		}
	}
}

// explain returns the plan PostgreSQL executes for sql with args, under
// plan_cache_mode mode, in a transaction rolled back after.
func explain(t *testing.T, conn *pgx.Conn, mode, sql string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = `+mode); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Prepare(ctx, "explained", sql); err != nil {
		t.Fatal(err)
	}
	defer tx.Conn().Deallocate(ctx, "explained")
	// EXPLAIN takes no parameters: the arguments go in as literals.
	params := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case nil:
			params[i] = "NULL"
		case int:
			params[i] = strconv.Itoa(v)
		case int64:
			params[i] = strconv.FormatInt(v, 10)
		case bool:
			params[i] = strconv.FormatBool(v)
		case string:
			params[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case []string:
			params[i] = "'{" + strings.Join(v, ",") + "}'"
		default:
			t.Fatalf("explain: no literal for %T", a)
		}
	}
	q := `EXPLAIN (ANALYZE, FORMAT TEXT) EXECUTE explained`
	if len(args) > 0 {
		q += "(" + strings.Join(params, ", ") + ")"
	}
	rows, err := tx.Query(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}

// TestOneKeyStatementsReadThePrimaryKey: a statement that addresses one
// action by its key reads the primary key, never a queue's partial
// index, whatever the statistics say. Statistics taken while the log
// held only finished actions make the queues' indexes look empty, and
// so cheaper than the primary key; a heartbeat or an outcome that
// matched the index's predicate would then walk every in-flight action,
// and every dead entry a vacuum has not yet removed, to find its one
// row. Checked with the plans PostgreSQL executes, custom and generic,
// after 6,000 actions entered the queues behind the statistics' back.
func TestOneKeyStatementsReadThePrimaryKey(t *testing.T) {
	ctx := context.Background()
	conn, s := planStore(t)
	table := s.names.Table("action")
	if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, completed_at, retain_until)
SELECT md5(g::text), '', 'r', g, 'k', '', 'succeeded', 1, now(), now() + interval '30 days' FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, lease_until)
SELECT md5('q' || g::text), 'fp', 'q', g, 'k', '', (ARRAY['in_flight', 'unknown', 'released'])[g % 3 + 1], 1, now() - interval '1 minute'
FROM generate_series(1, 6000) g`); err != nil {
		t.Fatal(err)
	}
	var key string
	if err := conn.QueryRow(ctx, `SELECT md5('q1')`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	outcome := transitionArgs(once.Transition{Key: once.Key(key), Attempt: 1, From: []once.Status{once.StatusInFlight, once.StatusUnknown},
		To: once.StatusSucceeded, Result: []byte(`{"id":"m"}`), Event: once.Event{Actor: "worker", From: once.StatusInFlight}})
	for _, c := range []struct {
		name, sql string
		args      []any
	}{
		{"a heartbeat", s.q.heartbeat, []any{key, 1, int64(60000000)}},
		{"an outcome", s.q.transition, outcome},
		{"a released action claimed again", s.q.reclaim, []any{key, "fp", int64(60000000), "tok", "", nil, nil, false, "o", false, []string{}, "released"}},
		{"an approved action claimed", s.q.reclaim, []any{key, "fp", int64(60000000), "tok", "", nil, nil, false, "o", true, []string{"verify_then_decide"}, "approved"}},
		{"inline recovery of one key", s.q.recoverKey, []any{key, int64(60000000), "tok", []string{}, false, []string{}, "{}", []string{"verify_then_decide"}}},
		{"a waiter's mark", s.q.await, []any{key, "in_flight", 1}},
	} {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			plan := explain(t, conn, mode, c.sql, c.args...)
			if !strings.Contains(plan, "_pkey") || strings.Contains(plan, "action_active") || strings.Contains(plan, "action_open") {
				t.Errorf("%s (%s) does not find its row by the primary key:\n%s", c.name, mode, plan)
			}
		}
	}
}

// planStore opens a store on a schema of its own, migrated, and a
// connection of the test's own to fill it and read plans; both are
// closed and the schema dropped when the test ends.
func planStore(t *testing.T) (*pgx.Conn, *Store) {
	t.Helper()
	return planStoreWith(t, nil)
}

// planStoreWith is planStore over a pool of its own, configured by tune
// when it is not nil.
func planStoreWith(t *testing.T, tune func(*pgxpool.Config)) (*pgx.Conn, *Store) {
	t.Helper()
	url := testdb.RequirePostgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "once_plan_" + hex.EncodeToString(b[:])
	// The store's connections, found by name (scanned).
	cfg.ConnConfig.RuntimeParams["application_name"] = schema
	if tune != nil {
		tune(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(pool, Config{Schema: schema})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		pool.Close()
		conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return conn, s
}

// TestGroupCommitReadsByKeyAsTheLogGrows: group commit's statements find
// each of their keys by the primary key, also with plans PostgreSQL made
// while the log was small and keeps after it grew. A deployment's first
// batches are planned on a table never analyzed, or analyzed by
// autovacuum after its first fifty rows, or by an operator while empty;
// a plan that hashed or scanned the whole table there, cheap while it
// is small, would read every row of the log for each batch until
// autovacuum's next analyze replaced it. Run through the store's own batches, with generic plans made at
// the first execution, autovacuum off on the table, and 20,000 actions
// written behind the plans' back; the server's count of rows read, by
// sequential scans and through indexes, says whether a batch read the
// log.
func TestGroupCommitReadsByKeyAsTheLogGrows(t *testing.T) {
	for _, c := range []struct {
		name    string
		rows    int  // finished actions in the log before the batches
		analyze bool // analyzed then
	}{
		{"a new log, never analyzed", 0, false},
		{"an empty log, analyzed", 0, true},
		{"a log analyzed after its first 10 actions", 10, true},
		{"a log analyzed after its first 60 actions", 60, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			conn, s, table := smallPlanStore(t)
			if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, completed_at, retain_until)
SELECT md5('a' || g::text), '', 'r', g, 'k', '', 'succeeded', 1, now(), now() + interval '30 days' FROM generate_series(1, $1) g`, c.rows); err != nil {
				t.Fatal(err)
			}
			if c.analyze {
				if _, err := conn.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
					t.Fatal(err)
				}
			}
			const batches, size = 4, 8
			batch := func(tag string) {
				t.Helper()
				reqs := make([]once.ClaimRequest, size)
				for i := range reqs {
					k := once.Key(md5Of(t, conn, tag+strconv.Itoa(i)))
					reqs[i] = once.ClaimRequest{Key: k, Fingerprint: "fp", Run: tag, Step: int64(i), Kind: "k", Target: "t", Lease: time.Minute, Token: tag}
				}
				res, errs := s.ClaimMany(ctx, reqs)
				ts := make([]once.Transition, size)
				for i := range reqs {
					if errs[i] != nil || !res[i].Claimed {
						t.Fatalf("claim %d of batch %s: %+v, %v", i, tag, res[i], errs[i])
					}
					ts[i] = succeedOne(reqs[i].Key)
				}
				ok, errs := s.TransitionMany(ctx, ts)
				for i := range ts {
					if errs[i] != nil || !ok[i] {
						t.Fatalf("outcome %d of batch %s: %v, %v", i, tag, ok[i], errs[i])
					}
				}
			}
			// The plans, made on the small log, on each connection.
			for b := range batches {
				batch("small" + strconv.Itoa(b))
			}
			if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, completed_at, retain_until)
SELECT md5('g' || g::text), '', 'r', g, 'k', '', 'succeeded', 1, now(), now() + interval '30 days' FROM generate_series(1, 20000) g`); err != nil {
				t.Fatal(err)
			}
			for b := range batches {
				batch("grown" + strconv.Itoa(b))
			}
			if read := scanned(t, conn, s, table, batches*size); read >= 20000 {
				t.Errorf("the batches read %d rows of the log by sequential scans and index fetches; each should have read only its %d keys, by the primary key", read, size)
			}
		})
	}
}

// TestOneKeyStatementsKeepThePrimaryKeyAsTheLogGrows: a claim and an
// outcome of one key keep reading it through the primary key as the log
// grows, with the plans PostgreSQL made after autovacuum's first
// analyze. A plan made on a log analyzed while a few pages long scans
// it (cheaper there than the index), and, kept, scans the grown log
// for every statement until the next analyze: autovacuum's defaults
// analyze a new table after its first fifty rows. The action table asks
// autovacuum for its first analyze, and its first vacuum, after a
// thousand rows instead, and a plan made at that size reads the
// primary key. Checked through the store's own statements (group
// commit off), with generic plans and 20,000 actions written behind
// their back.
func TestOneKeyStatementsKeepThePrimaryKeyAsTheLogGrows(t *testing.T) {
	ctx := context.Background()
	conn, s, table := smallPlanStore(t)
	var opts []string
	if err := conn.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, table).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	threshold := 0
	for _, o := range []string{"autovacuum_analyze_threshold", "autovacuum_vacuum_threshold"} {
		n := -1
		for _, kv := range opts {
			if v, ok := strings.CutPrefix(kv, o+"="); ok {
				n, _ = strconv.Atoi(v)
			}
		}
		if n < 1000 {
			t.Fatalf("the action table's %s is %d (reloptions %v); want at least 1,000, so that autovacuum's first statistics describe more than a few pages", o, n, opts)
		}
		threshold = n
	}
	// Autovacuum's first analyze, at the threshold: half of it claims,
	// half their outcomes.
	if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, completed_at, retain_until)
SELECT md5('a' || g::text), '', 'r', g, 'k', '', 'succeeded', 1, now(), now() + interval '30 days' FROM generate_series(1, $1) g`, threshold/2); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	s.batch = nil // the statements for one key, as Config.Unbatched sends them
	actions := func(tag string, n int) {
		t.Helper()
		for i := range n {
			k := once.Key(md5Of(t, conn, tag+strconv.Itoa(i)))
			if cr, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: "fp", Run: tag, Step: int64(i), Kind: "k", Target: "t", Lease: time.Minute, Token: tag}); err != nil || !cr.Claimed {
				t.Fatalf("claim %d of %s: %+v, %v", i, tag, cr, err)
			}
			if ok, err := s.Transition(ctx, succeedOne(k)); err != nil || !ok {
				t.Fatalf("outcome %d of %s: %v, %v", i, tag, ok, err)
			}
		}
	}
	actions("small", 12) // each statement's plan, on each connection
	if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, run_id, step, kind, target, status, attempt, completed_at, retain_until)
SELECT md5('g' || g::text), '', 'r', g, 'k', '', 'succeeded', 1, now(), now() + interval '30 days' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	const grown = 10
	actions("grown", grown)
	if read := scanned(t, conn, s, table, 12+grown); read >= 20000 {
		t.Errorf("the statements for one key read %d rows of the log by sequential scans and index fetches; each should have read its key only", read)
	}
}

// succeedOne is a worker's success of attempt 1 of k.
func succeedOne(k once.Key) once.Transition {
	return once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded,
		Result: []byte(`"ok"`), Event: once.Event{Actor: "worker", From: once.StatusInFlight}}
}

// scanned closes s and its pool, waits until their connections have
// ended, and with them sent their counts to the server's statistics,
// and until the statistics hold at least the given updates of table,
// then returns the rows of table that were read by sequential scans and
// fetched from its indexes.
func scanned(t *testing.T, conn *pgx.Conn, s *Store, table string, updates int64) int64 {
	t.Helper()
	ctx := context.Background()
	s.Close()
	s.pool.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var left, read, fetched, updated int64
		if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_stat_activity WHERE application_name = $2),
    coalesce(seq_tup_read, 0), coalesce(idx_tup_fetch, 0), n_tup_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			table, s.names.Schema).Scan(&left, &read, &fetched, &updated); err != nil {
			t.Fatal(err)
		}
		if left == 0 && updated >= updates {
			return read + fetched
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the store's connections remain, and the statistics count %d updates of %s, want %d: the store's counts never arrived", left, updated, table, updates)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// smallPlanStore is planStoreWith a pool of two connections that make
// generic plans at a statement's first execution, and autovacuum off on
// the action table, so that the plans made while the log is small are
// the ones kept. It also returns the action table.
func smallPlanStore(t *testing.T) (*pgx.Conn, *Store, string) {
	t.Helper()
	conn, s := planStoreWith(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 2
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	})
	table := s.names.Table("action")
	if _, err := conn.Exec(context.Background(), `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	return conn, s, table
}

// md5Of is md5(s) as PostgreSQL writes it, the key the plan tests give
// their rows.
func md5Of(t *testing.T, conn *pgx.Conn, s string) string {
	t.Helper()
	var h string
	if err := conn.QueryRow(context.Background(), `SELECT md5($1)`, s).Scan(&h); err != nil {
		t.Fatal(err)
	}
	return h
}
