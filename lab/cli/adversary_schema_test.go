package cli_test

import (
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdversaryServeOutlivesNewerSchema: every command refuses a schema
// newer than the binary, but `once serve` checks only when it starts. A
// newer once (a rolling upgrade's first process) migrates while an old
// console runs: `once ls` now refuses the database, yet the running
// console's /healthz still says ok, and it goes on resolving and reaping
// rows whose meaning it no longer knows.
func TestAdversaryServeOutlivesNewerSchema(t *testing.T) {
	db := filepath.Join(t.TempDir(), "once.db")
	mustRun(t, "migrate", "--db", db)
	base, _, _, _ := startServe(t, "--addr", "127.0.0.1:0", "--reap-every", "0", "--db", db)
	if code, body := get(t, base+"healthz"); code != 200 {
		t.Fatalf("/healthz before the upgrade: %d %q", code, body)
	}

	// A newer once migrates to a version this one does not know.
	raw, err := sql.Open("sqlite", db)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`INSERT INTO once_migration (version, name) VALUES ((SELECT max(version) + 1 FROM once_migration), 'from_a_newer_once')`); err != nil {
		t.Fatal(err)
	}
	code, _, lsErr := run(t, "ls", "--db", db)
	if code == 0 || !strings.Contains(lsErr, "upgrade once") {
		t.Fatalf("once ls on the newer schema: exit %d, %q; want the refusal", code, lsErr)
	}
	if code, body := get(t, base+"healthz"); code == 200 {
		t.Errorf("/healthz of the running console on a schema newer than it knows: %d %q; want 503 (the same refusal once ls gives)", code, body)
	}
}
