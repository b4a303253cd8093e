package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/bench"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestRunEveryArm runs every arm briefly against the real database, with
// a filled log and each PostgreSQL arm's twin on an empty one, and
// checks the report's shape and counts: every arm at every worker count
// did something, the PostgreSQL arms have commit and WAL figures and the
// SQLite ones none, every ratio is there, and the tables hold exactly
// the rows the arms say they wrote (so the replay arms wrote none, and
// the protocol arm one per action, as do). It
// asserts nothing about speed.
func TestRunEveryArm(t *testing.T) {
	url := testdb.RequirePostgres(t)
	const replayKeys, scale = 200, 50
	workers := []int{1, 4}
	rep, err := bench.Run(context.Background(), bench.Options{
		DB: url, Workers: workers, Rounds: 1, Duration: 100 * time.Millisecond,
		ReplayKeys: replayKeys, Scale: scale, Keep: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := testdb.RetryTooManyClients(context.Background(), func() (*pgx.Conn, error) { return pgx.Connect(context.Background(), url) })
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: it runs after the schema is dropped.
	t.Cleanup(func() { conn.Close(context.Background()) })
	t.Cleanup(func() {
		for _, schema := range []string{rep.Schema, rep.EmptySchema} {
			if _, err := conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
				t.Errorf("dropping the kept schema %s: %v", schema, err)
			}
		}
		os.RemoveAll(rep.Dir)
	})
	if rep.EmptySchema == "" {
		t.Fatal("a run with Scale and Keep names no empty log's schema")
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", text.String())

	// With Scale, each PostgreSQL arm has its twin on the empty log
	// right after it.
	var arms []string
	for _, a := range bench.Arms() {
		arms = append(arms, a)
		if !strings.HasPrefix(a, "sqlite_") {
			arms = append(arms, a+bench.EmptySuffix)
		}
	}
	if len(rep.Arms) != len(workers)*len(arms) {
		t.Fatalf("%d results, want %d (every arm and twin at every worker count)", len(rep.Arms), len(workers)*len(arms))
	}
	written := map[string]int64{}
	for i, a := range rep.Arms {
		if want := arms[i%len(arms)]; a.Name != want || a.Workers != workers[i/len(arms)] {
			t.Errorf("result %d is %s with %d workers, want %s with %d", i, a.Name, a.Workers, want, workers[i/len(arms)])
		}
		if a.Actions <= 0 || a.ActionsPerS <= 0 || a.P50us <= 0 || a.P99us < a.P50us {
			t.Errorf("%s with %d workers: %d actions, %v/s, p50 %vµs, p99 %vµs; want actions and latencies", a.Name, a.Workers, a.Actions, a.ActionsPerS, a.P50us, a.P99us)
		}
		sqlite := strings.HasPrefix(a.Name, "sqlite_")
		if sqlite != (a.CommitsPerAction == nil) || sqlite != (a.WALBytesPerAction == nil) {
			t.Errorf("%s with %d workers: commits %v, WAL %v; want both for PostgreSQL arms and neither for SQLite", a.Name, a.Workers, a.CommitsPerAction, a.WALBytesPerAction)
		}
		if f := a.WALFPIBytesPerAction; f != nil && (sqlite || *f < 0 || *f > *a.WALBytesPerAction) {
			t.Errorf("%s with %d workers: %v bytes of full-page images per action of %v WAL; want none for SQLite, and no more than the WAL", a.Name, a.Workers, *f, a.WALBytesPerAction)
		}
		written[a.Name] += a.Actions
	}

	var want []string
	for _, w := range workers {
		for _, p := range [][2]string{{"do_unbatched", "raw"}, {"do", "raw"}, {"do", "raw_batched"}, {"replay_do", "replay_raw"}, {"sqlite_do", "sqlite_raw"}, {"sqlite_do_unbatched", "sqlite_raw"},
			{"protocol", "do"}, {"replay_protocol", "replay_do"}, {"sqlite_protocol", "sqlite_do"},
			{"do_unbatched_empty", "raw_empty"}, {"do_empty", "raw_empty"}, {"do_empty", "raw_batched_empty"}, {"replay_do_empty", "replay_raw_empty"},
			{"protocol_empty", "do_empty"}, {"replay_protocol_empty", "replay_do_empty"}} {
			want = append(want, bench.RatioKey(p[0], p[1], w))
		}
		for _, a := range []string{"raw", "raw_batched", "do_unbatched", "do", "protocol", "replay_raw", "replay_do", "replay_protocol"} {
			want = append(want, bench.RatioKey(a, a+"_empty", w))
		}
	}
	var got []string
	for k, v := range rep.Ratios {
		got = append(got, k)
		if v <= 0 {
			t.Errorf("ratio %s is %v", k, v)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("ratios %v, want %v", got, want)
	}

	// The JSON shape.
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Arms   []map[string]any   `json:"arms"`
		Ratios map[string]float64 `json:"ratios"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, a := range doc.Arms {
		fields := []string{"name", "workers", "actions_per_s", "p50_us", "p99_us", "allocs_per_action"}
		if !strings.HasPrefix(a["name"].(string), "sqlite_") {
			fields = append(fields, "commits_per_action", "wal_bytes_per_action")
		}
		for _, f := range fields {
			if _, ok := a[f]; !ok {
				t.Errorf("JSON arm %v has no %q: %s", a["name"], f, b)
			}
		}
	}
	if len(doc.Ratios) != len(want) {
		t.Errorf("JSON has %d ratios, want %d: %s", len(doc.Ratios), len(want), b)
	}

	// The rows: each writing arm's actions, the fills, and nothing from
	// the replays. The filled log's replays read rows of the fill (had
	// replay_do met a key that was not there, it would have run the
	// effect, written a row, and said it was not a replay); the empty
	// log's, rows written for them.
	count := func(schema, table string) int64 {
		var n int64
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{schema, table}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, c := range []struct {
		schema, suffix string
		filled         int64
	}{{rep.Schema, "", scale}, {rep.EmptySchema, bench.EmptySuffix, min(replayKeys, scale)}} {
		if n, want := count(c.schema, "raw_action"), c.filled+written["raw"+c.suffix]+written["raw_batched"+c.suffix]; n != want {
			t.Errorf("%s: the raw table has %d rows, want %d: %d filled, %d raw, %d raw_batched", c.schema, n, want, c.filled, written["raw"+c.suffix], written["raw_batched"+c.suffix])
		}
		if n, want := count(c.schema, "once_action"), c.filled+written["do"+c.suffix]+written["do_unbatched"+c.suffix]+written["protocol"+c.suffix]; n != want {
			t.Errorf("%s: the action log has %d rows, want %d: %d filled, %d do, %d do_unbatched, %d protocol", c.schema, n, want, c.filled,
				written["do"+c.suffix], written["do_unbatched"+c.suffix], written["protocol"+c.suffix])
		}
		var unfinished int64
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{c.schema, "once_action"}.Sanitize()+` WHERE status <> 'succeeded'`).Scan(&unfinished); err != nil || unfinished != 0 {
			t.Errorf("%s: %d actions did not succeed (%v)", c.schema, unfinished, err)
		}
	}
	for _, a := range rep.Arms {
		if a.Name == bench.ArmReplayRaw || a.Name == bench.ArmReplayDo || a.Name == bench.ArmReplayProtocol {
			// Other tests share the cluster and write WAL meanwhile, so
			// the replays' figure is logged, not asserted.
			t.Logf("%s with %d workers: %v WAL bytes and %v commits per action", a.Name, a.Workers, *a.WALBytesPerAction, *a.CommitsPerAction)
		}
	}
}

// TestRunDropsItsSchema: without Keep, the run leaves no schema behind,
// the empty log's of a run with Scale included.
func TestRunDropsItsSchema(t *testing.T) {
	url := testdb.RequirePostgres(t)
	ctx := context.Background()
	conn, err := testdb.RetryTooManyClients(ctx, func() (*pgx.Conn, error) { return pgx.Connect(ctx, url) })
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	schemas := func() []string {
		rows, _ := conn.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE 'once\_bench\_%'`)
		ss, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ss
	}
	before := schemas()
	rep, err := bench.Run(ctx, bench.Options{DB: url, Workers: []int{2}, Rounds: 1, Duration: 20 * time.Millisecond, Arms: []string{bench.ArmRaw, bench.ArmSQLiteRaw}, Scale: 10})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Schema != "" || rep.EmptySchema != "" || rep.Dir != "" {
		t.Errorf("the report names a kept schema %q or %q or directory %q", rep.Schema, rep.EmptySchema, rep.Dir)
	}
	for _, s := range schemas() {
		if !slices.Contains(before, s) {
			t.Errorf("the run left its schema %s", s)
		}
	}
}
