package sqlite

import (
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/oncehq/once"
)

// TestPlans: the statements that must not read the whole log find their
// rows by an index, the partial ones of migration 007 included, whose
// use SQLite decides from the text of the query's WHERE clause.
func TestPlans(t *testing.T) {
	ctx := context.Background()
	s := migrated(t)
	list := func(f once.Filter) (string, []any) { return s.listQuery(f, false) }
	// A statement's parameters, ?1 to ?n, all NULL.
	stmt := func(id stmtID) func() (string, []any) {
		return func() (string, []any) {
			n := 0
			for _, m := range regexp.MustCompile(`\?(\d+)`).FindAllStringSubmatch(s.q.text[id], -1) {
				n = max(n, must(strconv.Atoi(m[1])))
			}
			return s.q.text[id], make([]any, n)
		}
	}
	for _, c := range []struct {
		name  string
		query func() (string, []any)
		want  []string
	}{
		{"review queue", func() (string, []any) { return list(once.Filter{Status: once.StatusReview}) }, []string{"once_action_open_idx"}},
		{"unknown outcomes", func() (string, []any) { return list(once.Filter{Status: once.StatusUnknown, OldestFirst: true}) }, []string{"once_action_open_idx"}},
		{"waiting", func() (string, []any) { return list(once.Filter{Waiting: true}) }, []string{"once_action_open_idx"}},
		{"a run's steps", func() (string, []any) { return list(once.Filter{Run: "r"}) }, []string{"once_action_run_idx"}},
		{"a run's failures", func() (string, []any) { return list(once.Filter{Run: "r", Status: once.StatusFailed}) }, []string{"once_action_run_idx"}},
		{"due", func() (string, []any) { return list(once.Filter{Due: true}) }, []string{"once_action_due_idx"}},
		{"recoverable", stmt(stRecoverable), []string{"once_action_due_idx"}},
		{"recover one key", stmt(stRecoverKey), []string{"sqlite_autoindex_once_action_1"}},
		{"claim's read", stmt(stSelectRow), []string{"sqlite_autoindex_once_action_1"}},
		{"outcome", stmt(stOutcome), []string{"sqlite_autoindex_once_action_1"}},
		{"transition", stmt(stTransition), []string{"sqlite_autoindex_once_action_1"}},
		{"heartbeat", stmt(stHeartbeat), []string{"sqlite_autoindex_once_action_1"}},
		{"reclaim", stmt(stReclaim), []string{"sqlite_autoindex_once_action_1"}},
		{"backfill", stmt(stBackfill), []string{"sqlite_autoindex_once_action_1", "once_event_key_idx"}},
		{"trail", stmt(stEvents), []string{"once_event_key_idx"}},
		{"purge", stmt(stPurgeDue), []string{"once_action_retain_idx"}},
		{"purge's count", stmt(stCountDue), []string{"once_action_retain_idx"}},
		{"open statuses' counts", stmt(stOpenStats), []string{"once_action_due_idx", "once_action_open_idx"}},
		{"the log's size", stmt(stEstimate), nil},
	} {
		q, args := c.query()
		rows, err := s.sqlDB.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		text := strings.Join(plan, "; ")
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: the plan does not use %s: %s", c.name, w, text)
			}
		}
		for _, step := range plan {
			if step == "SCAN once_action" || strings.HasPrefix(step, "SCAN once_action ") && !(openScan[c.name] && openIndex.MatchString(step)) {
				t.Errorf("%s: the plan reads the whole log: %s", c.name, text)
			}
		}
	}
}

// openScan names the statements that may read the whole of a partial
// index of open actions, which is reading the open actions, few
// whatever the log's size; openIndex matches such a read.
var openScan = map[string]bool{"open statuses' counts": true}

// openIndex matches a scan of the partial indexes of open actions.
var openIndex = regexp.MustCompile(`^SCAN once_action USING (COVERING )?INDEX once_action_(due|open)_idx\b`)

// migrated is a new, migrated store in the test's temporary directory,
// closed when the test ends.
func migrated(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "once.db"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
