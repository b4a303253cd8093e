package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

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
		{[]string{"bench", "--db", pg, "--arms", "raw,turbo"}, `--arms: no arm "turbo"; the arms are raw, raw_batched, do_unbatched, do, replay_raw, replay_do, sqlite_raw, sqlite_do_unbatched, sqlite_do`},
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
