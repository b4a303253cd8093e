package cli_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReadOnlyCommandsLeaveSQLiteAlone: ls and show read a SQLite file
// no process has open without writing it or creating its -wal and -shm
// files, which would be left owned by whoever ran them.
func TestReadOnlyCommandsLeaveSQLiteAlone(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	succeeded, _, _ := fill(t, db)
	for _, suffix := range []string{"-wal", "-shm"} {
		if _, err := os.Stat(db + suffix); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s%s exists before the commands run: %v", db, suffix, err)
		}
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(db, old, old); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(db)
	for _, args := range [][]string{
		{"ls"}, {"ls", "--json"}, {"show", string(succeeded)[:12]}, {"show", string(succeeded), "--json"},
	} {
		out := mustRun(t, append(args, "--db", db)...)
		if !strings.Contains(out, string(succeeded)[:12]) {
			t.Errorf("once %s does not show the action:\n%s", strings.Join(args, " "), out)
		}
		for _, suffix := range []string{"-wal", "-shm"} {
			if _, err := os.Stat(db + suffix); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("once %s left %s%s (%v)", strings.Join(args, " "), db, suffix, err)
				os.Remove(db + suffix)
			}
		}
		if fi, err := os.Stat(db); err != nil || !fi.ModTime().Equal(old) {
			t.Errorf("once %s changed the file's modification time: %v", strings.Join(args, " "), err)
		}
		if after, _ := os.ReadFile(db); string(after) != string(before) {
			t.Errorf("once %s changed the file", strings.Join(args, " "))
		}
	}
}

// TestDirectoryAsDatabase: a directory given as the SQLite file is named
// as one.
func TestDirectoryAsDatabase(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"migrate"}, {"ls"}, {"show", "abcdef01"}, {"reap"}} {
		code, out, errOut := run(t, append(args, "--db", dir)...)
		if code == 0 || !strings.Contains(errOut, "is a directory") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("once %s --db DIR: exit %d, stdout %q, stderr %q; want one line saying it is a directory", args[0], code, out, errOut)
		}
	}
}

// TestReadOnlyCommandsDoNotWaitForWriters: ls and show read while
// another process holds the write lock, as WAL allows; they take no lock
// of their own to wait for.
func TestReadOnlyCommandsDoNotWaitForWriters(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	succeeded, _, _ := fill(t, db)
	holder, err := sql.Open("sqlite", db)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	conn, err := holder.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), `ROLLBACK`)
	for _, args := range [][]string{{"ls"}, {"show", string(succeeded)}} {
		code, out, errOut := run(t, append(args, "--db", db)...)
		if code != 0 || !strings.Contains(out, string(succeeded)[:12]) {
			t.Errorf("once %s while another connection holds the write lock: exit %d, stdout %q, stderr %q", args[0], code, out, errOut)
		}
	}
}
