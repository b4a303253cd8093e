package storekit

import (
	"strings"
	"testing"
	"testing/fstest"
)

// LoadQueries keeps each named statement's SQL, without its comments,
// and refuses a file it would misread.
func TestLoadQueries(t *testing.T) {
	fsys := fstest.MapFS{"q.sql": {Data: []byte(`-- The store's statements.

-- name: get
-- One action, by its key.
SELECT $C FROM $T
WHERE key = $1

-- name: count
SELECT count(*) FROM $T -- every action
`)}}
	qs, err := LoadQueries(fsys, "q.sql")
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 2 || qs["get"] != "SELECT $C FROM $T\nWHERE key = $1" || qs["count"] != "SELECT count(*) FROM $T -- every action" {
		t.Fatalf("LoadQueries = %q", qs)
	}
	for name, bad := range map[string]string{
		"named twice":  "-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n",
		"is empty":     "-- name: a\n-- nothing\n",
		"SQL before":   "SELECT 1\n-- name: a\nSELECT 2\n",
		"no such file": "",
	} {
		fs := fstest.MapFS{"q.sql": {Data: []byte(bad)}}
		file := "q.sql"
		if bad == "" {
			file = "missing.sql"
		}
		if _, err := LoadQueries(fs, file); err == nil || (bad != "" && !strings.Contains(err.Error(), name)) {
			t.Errorf("LoadQueries of a file whose query %s = %v", name, err)
		}
	}
}

// A line that starts a statement in a spelling the name's grammar does
// not take ("-- name: getAction") is not a comment: read as one, its
// SQL would run as the tail of the statement before, and its name would
// be missing. LoadQueries refuses it, as it refuses a name given twice.
func TestLoadQueriesRefusesAMisspeltName(t *testing.T) {
	for _, line := range []string{"-- name: getAction", "-- name: get-action", "-- Name: get_action", "--  NAME:get_action", "-- name: 1get"} {
		fs := fstest.MapFS{"q.sql": {Data: []byte("-- name: get\nSELECT 1\n\n" + line + "\nSELECT 2\n")}}
		qs, err := LoadQueries(fs, "q.sql")
		if err == nil {
			t.Errorf("LoadQueries of a file with the line %q = %q, nil; want it refused", line, qs)
		}
	}
}
