package main

import (
	"bytes"
	"cmp"
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
)

// testURL is the database the tests connect to first; the run makes its
// contenders' databases beside it.
func testURL() string {
	return cmp.Or(os.Getenv("ONCE_TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test")
}

func TestMain(m *testing.M) {
	if err := probe(); err != nil {
		msg := "peers: PostgreSQL is not reachable at " + testURL() + " (" + err.Error() + "); start it or set ONCE_TEST_DATABASE_URL"
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, msg)
			os.Exit(1)
		}
		fmt.Println("skipping:", msg)
		os.Exit(0)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ad, err := openAdmin(ctx, testURL())
	if err != nil {
		return err
	}
	return ad.close(ctx)
}

// rowCounts are what each contender's database holds after a run.
type rowCounts struct {
	onceActions, onceSucceeded   int64
	dbosWorkflows, dbosSucceeded int64
	dbosSteps                    int64
	riverJobs                    int64
	databases                    []string
}

// count reads rowCounts from the contenders' databases.
func count(ctx context.Context, cs map[string]*contender) (rowCounts, error) {
	var rc rowCounts
	queries := []struct {
		contender string
		sql       string
		into      []any
	}{
		{"do", `SELECT count(*), count(*) FILTER (WHERE status = 'succeeded') FROM once.once_action`,
			[]any{&rc.onceActions, &rc.onceSucceeded}},
		{"dbos", `SELECT count(*), count(*) FILTER (WHERE status = 'SUCCESS') FROM dbos.workflow_status WHERE name = 'peers_one_step'`,
			[]any{&rc.dbosWorkflows, &rc.dbosSucceeded}},
		{"dbos", `SELECT count(*) FROM dbos.operation_outputs o JOIN dbos.workflow_status w USING (workflow_uuid) WHERE w.name = 'peers_one_step'`,
			[]any{&rc.dbosSteps}},
		{"river", `SELECT count(*) FROM river.river_job WHERE kind = 'peers_noop'`,
			[]any{&rc.riverJobs}},
	}
	for _, q := range queries {
		if err := cs[q.contender].pool.QueryRow(ctx, q.sql).Scan(q.into...); err != nil {
			return rc, fmt.Errorf("%s: %w", q.sql, err)
		}
	}
	for _, c := range cs {
		rc.databases = append(rc.databases, c.db)
	}
	return rc, nil
}

// TestRun runs every arm briefly at 1 and 4 workers against the real
// database, and checks the report's shape and that every action counted
// is in the contender's tables. It asserts nothing about speed.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var rc rowCounts
	workers := []int{1, 4}
	rep, err := run(ctx, options{
		db:       testURL(),
		workers:  workers,
		rounds:   2,
		duration: 150 * time.Millisecond,
		arms:     allArms,
		inspect: func(ctx context.Context, cs map[string]*contender) (err error) {
			rc, err = count(ctx, cs)
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	// One report per arm and worker count, workers outer, arms in order.
	if len(rep.Arms) != len(workers)*len(allArms) {
		t.Fatalf("%d arm reports, want %d: %+v", len(rep.Arms), len(workers)*len(allArms), rep.Arms)
	}
	totals := map[string]armReport{}
	for i, a := range rep.Arms {
		wantName, wantWorkers := allArms[i%len(allArms)], workers[i/len(allArms)]
		if a.Name != wantName || a.Workers != wantWorkers {
			t.Errorf("arm report %d is %s@%d, want %s@%d", i, a.Name, a.Workers, wantName, wantWorkers)
		}
		if a.ActionsPerS <= 0 || a.P50us <= 0 || a.P99us < a.P50us || a.CommitsPerAction <= 0 || a.actions <= 0 {
			t.Errorf("%s@%d: a figure is missing or out of order: %+v", a.Name, a.Workers, a)
		}
		if a.Name == armRiverInsertMany && a.actions%insertManyBatch != 0 {
			t.Errorf("river_insert_many@%d did %d actions, not a multiple of %d", a.Workers, a.actions, insertManyBatch)
		}
		tot := totals[a.Name]
		tot.actions += a.actions
		tot.retries += a.retries
		totals[a.Name] = tot
	}

	var wantRatios []string
	for _, w := range workers {
		for _, a := range allArms[1:] {
			wantRatios = append(wantRatios, fmt.Sprintf("do/%s@%d", a, w))
		}
	}
	var gotRatios []string
	for k, v := range rep.Ratios {
		gotRatios = append(gotRatios, k)
		if v <= 0 {
			t.Errorf("ratio %s is %v", k, v)
		}
	}
	slices.Sort(wantRatios)
	slices.Sort(gotRatios)
	if !slices.Equal(gotRatios, wantRatios) {
		t.Errorf("ratios %v, want %v", gotRatios, wantRatios)
	}

	// Every action measured is in its contender's tables. A call refused
	// at the connection limit is done again, and may have written.
	within := func(what string, got int64, arms ...string) {
		t.Helper()
		var lo, hi int64
		for _, a := range arms {
			batch := int64(1)
			if a == armRiverInsertMany {
				batch = insertManyBatch
			}
			lo += totals[a].actions
			hi += totals[a].actions + totals[a].retries*batch
		}
		if got < lo || got > hi {
			t.Errorf("%s: %d rows, want %d (up to %d with retried calls)", what, got, lo, hi)
		}
	}
	within("once actions", rc.onceActions, armDo)
	within("once actions succeeded", rc.onceSucceeded, armDo)
	within("DBOS workflows", rc.dbosWorkflows, armDBOSWorkflow)
	within("DBOS workflows succeeded", rc.dbosSucceeded, armDBOSWorkflow)
	within("DBOS steps", rc.dbosSteps, armDBOSWorkflow)
	within("River jobs", rc.riverJobs, armRiverInsert, armRiverInsertMany)

	// The run removed the databases it made.
	if len(rc.databases) != 3 {
		t.Fatalf("databases %v, want one per contender", rc.databases)
	}
	conn, err := pgx.Connect(ctx, testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = ANY($1)`, rc.databases).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d of the databases %v are still there after the run", left, rc.databases)
	}

	// --json prints exactly the documented fields.
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(rep); err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Arms   []map[string]any   `json:"arms"`
		Ratios map[string]float64 `json:"ratios"`
	}
	if err := json.Unmarshal(buf.Bytes(), &decoded); err != nil {
		t.Fatal(err)
	}
	wantFields := []string{"actions_per_s", "commits_per_action", "name", "p50_us", "p99_us", "wal_bytes_per_action", "workers"}
	for _, a := range decoded.Arms {
		var fields []string
		for k := range a {
			fields = append(fields, k)
		}
		slices.Sort(fields)
		if !slices.Equal(fields, wantFields) {
			t.Errorf("JSON arm has fields %v, want %v", fields, wantFields)
		}
	}
	if len(decoded.Ratios) != len(wantRatios) {
		t.Errorf("JSON has %d ratios, want %d", len(decoded.Ratios), len(wantRatios))
	}

	var table bytes.Buffer
	if err := printTable(&table, rep, workers); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(table.String(), "\n"); lines != 1+len(rep.Arms)+2+len(wantRatios) {
		t.Errorf("table has %d lines, want a header, %d arms, a blank and a title, and %d ratios:\n%s",
			lines, len(rep.Arms), len(wantRatios), table.String())
	}
}

// TestBadOptions: every setting that cannot be measured is refused before
// anything connects, with the flag it came from named.
func TestBadOptions(t *testing.T) {
	good := options{db: testURL(), workers: []int{1}, rounds: 1, duration: time.Second, arms: allArms}
	for _, tc := range []struct {
		name   string
		change func(*options)
		want   string
	}{
		{"no workers", func(o *options) { o.workers = nil }, "--workers"},
		{"zero workers", func(o *options) { o.workers = []int{1, 0} }, "--workers"},
		{"zero rounds", func(o *options) { o.rounds = 0 }, "--rounds"},
		{"zero duration", func(o *options) { o.duration = 0 }, "--duration"},
		{"unknown arm", func(o *options) { o.arms = []string{"do", "temporal"} }, "--arms"},
		{"no arms", func(o *options) { o.arms = nil }, "--arms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.change(&o)
			_, err := run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run: %v, want an error naming %s", err, tc.want)
			}
		})
	}
	for _, s := range []string{"1,x", "0", "-4", "1,,2.5"} {
		if _, err := parseWorkers(s); err == nil {
			t.Errorf("parseWorkers(%q) accepted it", s)
		}
	}
	if ws, err := parseWorkers(" 1, 16,64 "); err != nil || !slices.Equal(ws, []int{1, 16, 64}) {
		t.Errorf("parseWorkers: %v, %v; want [1 16 64]", ws, err)
	}
	if err := mainErr([]string{"--db", testURL(), "extra"}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Error("mainErr accepted a positional argument")
	}
}
