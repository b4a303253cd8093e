package cli_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once/internal/testdb"
)

// TestBenchRefusesBadInput: a mistake is one line naming it, before
// anything connects (the server named here does not exist).
func TestBenchRefusesBadInput(t *testing.T) {
	const pg = "postgres://u@127.0.0.1:1/db"
	sqlite := filepath.Join(t.TempDir(), "once.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--db", pg, "--arms", "raw,turbo"}, `--arms: no arm "turbo"; the arms are raw, raw_batched, do_unbatched, do, protocol, replay_raw, replay_do, replay_protocol, sqlite_raw, sqlite_do_unbatched, sqlite_do, sqlite_protocol`},
		{[]string{"bench", "--db", pg, "--workers", "1,many"}, `--workers: "many" is not a number; give a comma-separated list such as 1,16,64`},
		{[]string{"bench", "--db", pg, "--workers", "0"}, "--workers: a worker count must be between 1 and 512, not 0"},
		{[]string{"bench", "--db", pg, "--rounds", "0"}, "--rounds must be at least 1, not 0"},
		{[]string{"bench", "--db", pg, "--duration", "0s"}, "--duration must be positive, not 0s"},
		{[]string{"bench", "--db", pg, "--duration", "1ms"}, "duration must be between 10ms and 1h0m0s, not 1ms"},
		{[]string{"bench", "--db", pg, "--scale", "-1"}, "scale must be between 0 and"},
		{[]string{"bench", "--db", sqlite}, "the database must be PostgreSQL (--db postgres://user@host:5432/db), not a SQLite file"},
		{[]string{"bench", "--db", "sqlite:" + sqlite}, "not a SQLite file"},
		{[]string{"bench", "--db", pg + "?once_schema=mine"}, "leave once_schema and once_prefix out"},
	} {
		code, out, stderr := run(t, tc.args...)
		if code == 0 || !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") > 1 || out != "" {
			t.Errorf("once %s: exit %d, stdout %q, stderr %q; want a failure saying %q in a line or two", strings.Join(tc.args, " "), code, out, stderr, tc.want)
		}
		if strings.Contains(stderr, "connect") {
			t.Errorf("once %s tried to connect: %q", strings.Join(tc.args, " "), stderr)
		}
	}
}

// TestBenchJSON: a short run's --json is one object with the arms asked
// for and their ratio.
func TestBenchJSON(t *testing.T) {
	url := testdb.RequirePostgres(t)
	out := mustRun(t, "bench", "--db", url, "--workers", "2", "--rounds", "1", "--duration", "30ms", "--arms", "do,raw", "--json")
	var rep struct {
		Arms []struct {
			Name    string  `json:"name"`
			Workers int     `json:"workers"`
			Rate    float64 `json:"actions_per_s"`
		} `json:"arms"`
		Ratios map[string]float64 `json:"ratios"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("once bench --json: %v\n%s", err, out)
	}
	if len(rep.Arms) != 2 || rep.Arms[0].Name != "raw" || rep.Arms[1].Name != "do" || rep.Arms[0].Workers != 2 || rep.Arms[0].Rate <= 0 || rep.Arms[1].Rate <= 0 {
		t.Errorf("once bench --json: arms %+v, want raw then do with 2 workers, each with a rate", rep.Arms)
	}
	if _, ok := rep.Ratios["do/raw@2"]; !ok || len(rep.Ratios) != 1 {
		t.Errorf("once bench --json: ratios %v, want do/raw@2 alone", rep.Ratios)
	}
}

// TestBenchProtocolArms: the protocol arms, run beside the Do they go
// through on both stores, leave in each ledger one finished action per
// action they counted, each claimed once (attempt 1, the worker's steps
// 0 to n-1) and recorded with Do's result; and the report has the ratio
// of each over its Do.
func TestBenchProtocolArms(t *testing.T) {
	url := testdb.RequirePostgres(t)
	const workers = 3
	out := mustRun(t, "bench", "--db", url, "--workers", "3", "--rounds", "2", "--duration", "100ms",
		"--arms", "do,protocol,sqlite_do,sqlite_protocol", "--keep", "--json")
	var rep struct {
		Arms []struct {
			Name    string `json:"name"`
			Workers int    `json:"workers"`
			Actions int64  `json:"actions"`
		} `json:"arms"`
		Ratios map[string]float64 `json:"ratios"`
		Schema string             `json:"schema"`
		Dir    string             `json:"dir"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("once bench --json: %v\n%s", err, out)
	}
	tag, ok := strings.CutPrefix(rep.Schema, "once_bench_")
	if !ok || rep.Dir == "" {
		t.Fatalf("once bench --keep names schema %q and directory %q", rep.Schema, rep.Dir)
	}
	ctx := context.Background()
	conn, err := testdb.RetryTooManyClients(ctx, func() (*pgx.Conn, error) { return pgx.Connect(ctx, url) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{rep.Schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("dropping the kept schema %s: %v", rep.Schema, err)
		}
		conn.Close(ctx)
		os.RemoveAll(rep.Dir)
	})
	lite, err := sql.Open("sqlite", filepath.Join(rep.Dir, "once.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()

	counted := map[string]int64{}
	for _, a := range rep.Arms {
		counted[a.Name] += a.Actions
	}
	for _, r := range []string{"protocol/do@3", "sqlite_protocol/sqlite_do@3"} {
		if v := rep.Ratios[r]; v <= 0 {
			t.Errorf("ratio %s is %v; ratios %v", r, v, rep.Ratios)
		}
	}

	// Per arm, its workers' runs: how many actions, the steps they span,
	// and how many are not a first attempt that succeeded with Do's
	// result.
	perRun := func(table, result, param string) string {
		return `SELECT count(*), coalesce(max(step), -1),
  count(*) FILTER (WHERE status <> 'succeeded' OR attempt <> 1 OR ` + result + ` IS DISTINCT FROM '{"id":"msg-0123456789"}' OR completed_at IS NULL)
FROM ` + table + ` WHERE run_id LIKE ` + param + ` GROUP BY run_id`
	}
	pg := pgRuns(ctx, conn, perRun(pgx.Identifier{rep.Schema, "once_action"}.Sanitize(), "result::text", "$1"))
	lt := sqliteRuns(ctx, lite, perRun("once_action", "result", "?"))
	for _, c := range []struct {
		arm   string
		query func(like string) ([][3]int64, error)
	}{{"do", pg}, {"protocol", pg}, {"sqlite_do", lt}, {"sqlite_protocol", lt}} {
		runs, err := c.query("bench-" + tag + "-" + c.arm + "-%")
		if err != nil {
			t.Fatalf("%s: reading the ledger: %v", c.arm, err)
		}
		var rows int64
		for _, r := range runs {
			rows += r[0]
			if r[1] != r[0]-1 || r[2] != 0 {
				t.Errorf("%s: a worker's run has %d actions up to step %d, %d of them not succeeded on attempt 1 with the result", c.arm, r[0], r[1], r[2])
			}
		}
		// Each round starts workers of their own.
		if rows != counted[c.arm] || counted[c.arm] == 0 || len(runs) > 2*workers {
			t.Errorf("%s: the ledger has %d actions in %d runs; the report counted %d", c.arm, rows, len(runs), counted[c.arm])
		}
	}
}

// pgRuns and sqliteRuns read the rows of query, three numbers each.
func pgRuns(ctx context.Context, conn *pgx.Conn, query string) func(string) ([][3]int64, error) {
	return func(like string) ([][3]int64, error) {
		rows, _ := conn.Query(ctx, query, like)
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) ([3]int64, error) {
			var v [3]int64
			err := r.Scan(&v[0], &v[1], &v[2])
			return v, err
		})
	}
}

func sqliteRuns(ctx context.Context, db *sql.DB, query string) func(string) ([][3]int64, error) {
	return func(like string) ([][3]int64, error) {
		rows, err := db.QueryContext(ctx, query, like)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out [][3]int64
		for rows.Next() {
			var v [3]int64
			if err := rows.Scan(&v[0], &v[1], &v[2]); err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, rows.Err()
	}
}
