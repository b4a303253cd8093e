package cli_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMigratePrintNeedsNoDatabase: migrate --print renders the SQL for
// the URL's schema and prefix without connecting or creating anything.
func TestMigratePrintNeedsNoDatabase(t *testing.T) {
	out := mustRun(t, "migrate", "--print", "--db", "postgres://nobody:pw@127.0.0.1:1/nowhere?once_schema=billing&once_prefix=x_")
	if !strings.Contains(out, `"billing"."x_action"`) || !strings.Contains(out, "-- 001_") {
		t.Errorf("migrate --print for PostgreSQL said:\n%s", out)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "new.db")
	out = mustRun(t, "migrate", "--print", "--db", file)
	if !strings.Contains(out, `"once_action"`) || !strings.Contains(out, "-- 001_") {
		t.Errorf("migrate --print for SQLite said:\n%s", out)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("migrate --print created %s", file)
	}
	if out := mustRun(t, "migrate", "--print", "--db", dir); !strings.Contains(out, "CREATE TABLE") {
		t.Errorf("migrate --print with a directory said:\n%s", out)
	}
	code, _, errOut := run(t, "migrate", "--print", "--db", "postgres://h/db?once_schema=a%3Bb")
	if code == 0 || !strings.Contains(errOut, `once_schema "a;b"`) {
		t.Errorf("migrate --print with a bad schema: exit %d, %s", code, errOut)
	}
}
