package cli_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncehq/once"
)

// TestLsShowsReason: ls has a REASON column with the action's error,
// clipped to a column and escaped for the terminal.
func TestLsShowsReason(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	fill(t, db)
	withClient(t, db, once.Config{}, func(c *once.Client, _ once.Store) {
		in := once.Intent{Run: "run-c", Kind: "charge", Target: "acct-1"}
		once.Do(context.Background(), c, in, func(context.Context, once.Attempt) (string, error) {
			return "", errors.New("declined\nforged line\x1b[2J" + strings.Repeat(" and more", 20))
		})
	})
	out := mustRun(t, "ls", "--db", db)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.Contains(lines[0], "REASON") {
		t.Fatalf("ls has no REASON column:\n%s", out)
	}
	if !strings.Contains(out, "connection reset after DATA") {
		t.Errorf("ls does not show the review action's reason:\n%s", out)
	}
	if len(lines) != 5 || strings.Contains(out, "\x1b") || !strings.Contains(out, `declined\nforged line\x1b[2J`) || strings.Contains(out, "and more and more and more and more and more and more and more") {
		t.Errorf("the reason is not escaped and clipped to one line each:\n%s", out)
	}
}
