package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/oncehq/once/lab/cli"
)

// TestConcurrentMigrateReportsWhatItApplied: of migrators racing on a new
// database, one applies the migrations and says so; the others find them
// applied and say that.
func TestConcurrentMigrateReportsWhatItApplied(t *testing.T) {
	for name, newDB := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := newDB(t)
			latest := latestMigration(t, name)
			outs := make([]string, 4)
			var wg sync.WaitGroup
			for i := range outs {
				wg.Go(func() {
					var out, errOut bytes.Buffer
					if code := cli.Run(context.Background(), []string{"migrate", "--db", db}, &out, &errOut); code != 0 {
						t.Errorf("migrate %d: exit %d: %s", i, code, errOut.String())
					}
					outs[i] = out.String()
				})
			}
			wg.Wait()
			applied, already := 0, 0
			for _, out := range outs {
				switch {
				case strings.Contains(out, fmt.Sprintf("migrated from version 0 to %d", latest)):
					applied++
				case strings.Contains(out, fmt.Sprintf("already at version %d", latest)):
					already++
				}
			}
			if applied != 1 || already != len(outs)-1 {
				t.Fatalf("concurrent migrate runs said:\n%s", strings.Join(outs, ""))
			}
		})
	}
}

// TestSmallMessages: each of these mistakes is named for what it is.
func TestSmallMessages(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "once.db")
	mustRun(t, "migrate", "--db", db)
	succeeded, review, _ := fill(t, db)
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte("\"\xff\""), 0o644)

	// A key in capitals is the same key.
	if code, out, _ := run(t, "show", strings.ToUpper(string(succeeded)[:12]), "--db", db); code != 0 || !strings.Contains(out, string(succeeded)) {
		t.Errorf("show of an uppercase key prefix said:\n%s", out)
	}
	if code, out, _ := run(t, "show", strings.ToUpper(string(succeeded)), "--db", db); code != 0 || !strings.Contains(out, string(succeeded)) {
		t.Errorf("show of an uppercase key said:\n%s", out)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"key", "--run", "r", "--kind", "k", "--payload-file", bad}, []string{"--payload-file", "--raw"}},
		{[]string{"resolve", string(review), "--retry", "--note", "a\x00b", "--db", db}, []string{"--note", "NUL"}},
	} {
		code, out, errOut := run(t, tc.args...)
		for _, w := range tc.want {
			if code == 0 || !strings.Contains(errOut, w) {
				t.Errorf("once %q: exit %d, stdout %q, stderr %q; want %q", tc.args, code, out, errOut, w)
			}
		}
	}
	if _, _, errOut := run(t, "key", "--run", "r", "--kind", "k", "--payload-file", bad); strings.Contains(errOut, "--payload ") {
		t.Errorf("the key error names a flag --payload that does not exist: %s", errOut)
	}
	if _, _, errOut := run(t, "resolve", string(review), "--retry", "--note", "a\x00b", "--db", db); strings.Contains(errOut, "UTF-8") {
		t.Errorf("a NUL in the note is called invalid UTF-8: %s", errOut)
	}
}
