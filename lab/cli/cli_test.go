package cli_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/lab/cli"
	"github.com/oncehq/once/lab/demo"
)

func TestMain(m *testing.M) {
	// `once demo` starts workers by running this binary again.
	if demo.IsWorker() {
		os.Exit(demo.WorkerMain(os.Stderr))
	}
	os.Exit(m.Run())
}

// run runs the command line as the binary would and returns its exit
// code and output.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := run(t, args...)
	if code != 0 {
		t.Fatalf("once %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// databases yields the two kinds of database the command takes.
func databases(t *testing.T) map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"sqlite": func(t *testing.T) string { return filepath.Join(t.TempDir(), "once.db") },
		"postgres": func(t *testing.T) string {
			url := testdb.RequirePostgres(t)
			var b [6]byte
			rand.Read(b[:])
			schema := "once_cli_" + hex.EncodeToString(b[:])
			t.Cleanup(func() {
				conn, err := pgx.Connect(context.Background(), url)
				if err == nil {
					conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
					conn.Close(context.Background())
				}
			})
			sep := "?"
			if strings.Contains(url, "?") {
				sep = "&"
			}
			return url + sep + "once_schema=" + schema
		},
	}
}

// fill puts a succeeded, a review and a lapsed in-flight action in db.
func fill(t *testing.T, db string) (succeeded, review, dead once.Key) {
	t.Helper()
	ctx := context.Background()
	s, err := dburl.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, _ := once.New(once.Config{Store: s})
	ok := once.Intent{Run: "run-a", Step: 0, Kind: "send_email", Target: "ada@example.com"}
	once.Do(ctx, c, ok, func(context.Context, once.Attempt) (string, error) { return "msg-1", nil })
	rv := once.Intent{Run: "run-a", Step: 1, Kind: "send_email", Target: "bob@example.com"}
	once.Do(ctx, c, rv, func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("connection reset after DATA")
	})
	dd := once.Intent{Run: "run-b", Step: 0, Kind: "post_message", Target: "#general"}
	k, fp, _ := once.KeyOf(dd)
	if _, err := s.Claim(ctx, once.ClaimRequest{Key: k, Fingerprint: fp, Run: dd.Run, Kind: dd.Kind, Target: dd.Target, Lease: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	k1, _, _ := once.KeyOf(ok)
	k2, _, _ := once.KeyOf(rv)
	return k1, k2, k
}

// latestMigration counts the store's migration files: the version a
// fresh database is migrated to.
func latestMigration(t *testing.T, store string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", store, "migrations", "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations for %s: %v", store, err)
	}
	return len(files)
}

func TestCommands(t *testing.T) {
	for name, newDB := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := newDB(t)
			latest := latestMigration(t, name)
			out := mustRun(t, "migrate", "--db", db)
			if !strings.Contains(out, fmt.Sprintf("migrated from version 0 to %d", latest)) {
				t.Fatalf("migrate said %q", out)
			}
			if out := mustRun(t, "migrate", "--db", db); !strings.Contains(out, fmt.Sprintf("already at version %d", latest)) {
				t.Fatalf("second migrate said %q", out)
			}
			if out := mustRun(t, "migrate", "--print", "--db", db); !strings.Contains(out, "CREATE TABLE") || !strings.Contains(out, "-- 002_recovery") {
				t.Fatalf("migrate --print said %q", out)
			}
			succeeded, review, dead := fill(t, db)

			// ls, as a table and as JSON, with filters.
			out = mustRun(t, "ls", "--db", db)
			for _, want := range []string{"KEY", "succeeded", "review", "in_flight", "ada@example.com"} {
				if !strings.Contains(out, want) {
					t.Errorf("ls lacks %q:\n%s", want, out)
				}
			}
			var rows []map[string]any
			if err := json.Unmarshal([]byte(mustRun(t, "ls", "--status", "review", "--json", "--db", db)), &rows); err != nil || len(rows) != 1 || rows[0]["key"] != string(review) {
				t.Fatalf("ls --status review --json = %v, %v", rows, err)
			}
			if err := json.Unmarshal([]byte(mustRun(t, "ls", "--run", "run-a", "--kind", "send_email", "--json", "--since", "1h", "--db", db)), &rows); err != nil || len(rows) != 2 {
				t.Fatalf("ls --run --kind = %d rows, %v", len(rows), err)
			}

			// show, by a prefix of the key, with its trail.
			out = mustRun(t, "show", string(succeeded)[:12], "--db", db)
			if !strings.Contains(out, string(succeeded)) || !strings.Contains(out, `"msg-1"`) || !strings.Contains(out, "claimed") {
				t.Fatalf("show said:\n%s", out)
			}
			var shown map[string]any
			json.Unmarshal([]byte(mustRun(t, "show", string(review), "--json", "--db", db)), &shown)
			if shown["status"] != "review" || len(shown["events"].([]any)) != 2 {
				t.Fatalf("show --json = %v", shown)
			}

			// resolve: refused without a note, then done with a result.
			if code, _, errOut := run(t, "resolve", string(review), "--done", "--db", db); code == 0 || !strings.Contains(errOut, "--note is required") {
				t.Fatalf("resolve without a note: exit %d, %s", code, errOut)
			}
			out = mustRun(t, "resolve", string(review), "--done", "--result", `"msg-2"`, "--note", "found it in the mail log", "--by", "ada", "--db", db)
			if !strings.Contains(out, "is now succeeded") {
				t.Fatalf("resolve said %q", out)
			}
			if code, _, errOut := run(t, "resolve", string(review), "--abandon", "--note", "again", "--db", db); code == 0 || !strings.Contains(errOut, "refused") {
				t.Fatalf("resolving twice: exit %d, %s", code, errOut)
			}

			// reap: the lapsed claim goes to review.
			var rep once.ReapReport
			if err := json.Unmarshal([]byte(mustRun(t, "reap", "--json", "--db", db)), &rep); err != nil || rep.Review != 1 || rep.Examined != 1 {
				t.Fatalf("reap --json = %+v, %v", rep, err)
			}
			if out := mustRun(t, "show", string(dead), "--db", db); !strings.Contains(out, "review") || !strings.Contains(out, "lease expired") {
				t.Fatalf("after reap, show said:\n%s", out)
			}

			// purge: nothing is old enough by default; with --older-than the two finished go.
			if out := mustRun(t, "purge", "--dry-run", "--db", db); !strings.Contains(out, "0 finished actions would be purged") {
				t.Fatalf("purge --dry-run said %q", out)
			}
			time.Sleep(20 * time.Millisecond)
			if out := mustRun(t, "purge", "--older-than", "1ms", "--db", db); !strings.Contains(out, "purged 2 finished actions") {
				t.Fatalf("purge said %q", out)
			}
			if code, _, errOut := run(t, "show", string(succeeded), "--db", db); code != 1 || !strings.Contains(errOut, "not found") {
				t.Fatalf("show of a purged action: exit %d, %s", code, errOut)
			}
		})
	}
}

func TestKey(t *testing.T) {
	dir := t.TempDir()
	payload := filepath.Join(dir, "p.json")
	os.WriteFile(payload, []byte(`{ "subject": "hi" }`), 0o644)
	out := mustRun(t, "key", "--run", "run-1", "--step", "2", "--kind", "send_email", "--target", "ada@example.com", "--payload-file", payload)
	// The same key the library computes (and the golden test pins).
	if !strings.Contains(out, "2d006585b492e8d9faa9791fa7ebec5a1acc43d6e649b3791c2a0348486f8958") ||
		!strings.Contains(out, "51b94bbce0a3d7429558154aced561dc136ce68c0fe8f3a4209bd2f004288946") {
		t.Fatalf("key said %q", out)
	}
	var j map[string]string
	json.Unmarshal([]byte(mustRun(t, "key", "--run", "r", "--kind", "k", "--json")), &j)
	if len(j["key"]) != 64 || len(j["fingerprint"]) != 64 {
		t.Fatalf("key --json = %v", j)
	}
}

// TestBadInput: each mistake is one clear line, a non-zero exit, and
// nothing written.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.db")
	empty := filepath.Join(dir, "empty.db")
	os.WriteFile(empty, nil, 0o644)
	// A resolution is checked by the client, which needs a database; an
	// empty one shows it is checked before the key is looked up.
	migrated := filepath.Join(dir, "migrated.db")
	mustRun(t, "migrate", "--db", migrated)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, "unknown command"},
		{[]string{"ls", "--db", missing}, "no database at"},
		{[]string{"ls", "--db", empty}, "no once schema; run 'once migrate"},
		{[]string{"ls", "--db", "mysql://root@localhost/test"}, `scheme "mysql" is not supported`},
		{[]string{"ls", "--db", "postgres://postgres@127.0.0.1:1/test?connect_timeout=5"}, "postgres store at 127.0.0.1:1"},
		{[]string{"ls", "--status", "done", "--db", missing}, `--status "done" is not a status`},
		{[]string{"ls", "--limit", "0", "--db", missing}, "--limit must be positive"},
		{[]string{"ls", "--limit", "1001", "--db", missing}, "--limit 1001 is over 1000, the most one list prints"},
		{[]string{"ls", "--bogus"}, "flag provided but not defined"},
		{[]string{"ls", "extra", "--db", missing}, `takes no arguments, but was given "extra"`},
		// A stray word on a destructive command is refused, not ignored:
		// "dry-run" without its dashes must not purge for real.
		{[]string{"purge", "dry-run", "--older-than", "1s", "--db", migrated}, `takes no arguments, but was given "dry-run"`},
		{[]string{"key", "--kind", "k"}, "--run is required"},
		{[]string{"key", "--run", "", "--kind", "k"}, "--run is empty"},
		{[]string{"key", "--run", "r", "--kind", "k", "--step", "-1"}, "--step is -1"},
		{[]string{"key", "--run", "r", "--kind", "k", "--payload-file", filepath.Join(dir, "nope.json")}, "no such file"},
		{[]string{"resolve", "--db", missing}, "give one key"},
		{[]string{"resolve", "abcdefgh", "--done", "--retry", "--note", "x", "--db", missing}, "exactly one of"},
		{[]string{"resolve", "abcdefgh", "--note", "x", "--db", missing}, "exactly one of --done, --retry, --abandon"},
		{[]string{"resolve", "abcdefgh", "--done", "--db", missing}, "--note is required"},
		{[]string{"resolve", "abcdefgh", "--done", "--result", "{", "--note", "x", "--db", migrated}, "--result is not valid JSON"},
		{[]string{"resolve", "abcdefgh", "--retry", "--result", "1", "--note", "x", "--db", migrated}, "--result is only stored with Done"},
		{[]string{"resolve", "abcdefgh", "--done", "--note", "  ", "--db", migrated}, "--note is empty"},
		{[]string{"resolve", "abcdefgh", "--done", "--note", "x", "--by", strings.Repeat("x", 300), "--db", migrated}, "--by is 300 bytes"},
		{[]string{"serve", "--addr", "0.0.0.0:0", "--db", missing}, "set --token"},
		{[]string{"serve", "--addr", "0.0.0.0:0", "--token", "hunter2", "--db", missing}, "--token is 7 characters; off loopback it must be at least 16"},
		{[]string{"serve", "--addr", "nope", "--db", missing}, "is not host:port"},
		{[]string{"demo", "--intents", "0"}, "--intents must be"},
		{[]string{"reap", "--every", "-1s", "--db", missing}, "--every must not be negative"},
		{[]string{"reap", "--every", "1ns", "--db", missing}, "--every 1ns is under a second"},
		{[]string{"serve", "--reap-every", "10ms", "--db", missing}, "--reap-every 10ms is under a second"},
	}
	for _, tc := range cases {
		code, out, errOut := run(t, tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("once %s: exit %d, stderr %q, stdout %q; want an error containing %q", strings.Join(tc.args, " "), code, errOut, out, tc.want)
		}
		if strings.Count(strings.TrimSpace(errOut), "\n") > 1 {
			t.Errorf("once %s: more than a line or two of error:\n%s", strings.Join(tc.args, " "), errOut)
		}
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed command created %s", missing)
	}
	if b, _ := os.ReadFile(empty); len(b) != 0 {
		t.Fatalf("a failed command wrote to %s", empty)
	}
}

// TestDemoJSON runs the main job in its short form through the command
// line: naive sends duplicates, once none, nothing lost, workers killed.
func TestDemoJSON(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	out := mustRun(t, "demo", "--json", "--intents", "40", "--db", db)
	var rep struct {
		Intents int `json:"intents"`
		Kills   int `json:"kills"`
		Naive   struct{ Delivered, Duplicates, Lost int }
		Once    struct{ Delivered, Duplicates, Review, Lost int }
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("demo --json printed %q: %v", out, err)
	}
	if rep.Intents != 40 || rep.Kills == 0 || rep.Naive.Duplicates == 0 || rep.Once.Duplicates != 0 || rep.Once.Lost != 0 {
		t.Fatalf("demo = %+v", rep)
	}
	// What the demo left for review is what `once ls` shows.
	var rows []map[string]any
	json.Unmarshal([]byte(mustRun(t, "ls", "--status", "review", "--json", "--db", db)), &rows)
	if len(rows) != rep.Once.Review {
		t.Fatalf("ls shows %d for review, the demo reported %d", len(rows), rep.Once.Review)
	}
}
