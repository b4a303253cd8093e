package storekit

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	_ "modernc.org/sqlite"

	"github.com/oncehq/once"
)

// sqliteTx runs ApplyMigrations in a real SQLite transaction, the way the sqlite
// store does.
func sqliteTx(t *testing.T, db *sql.DB, ms []once.Migration) error {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = ApplyMigrations(ctx, MigrationTx{
		Exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := tx.ExecContext(ctx, sql, args...)
			return err
		},
		Ints: func(ctx context.Context, sql string) ([]int, error) {
			rows, err := tx.QueryContext(ctx, sql)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return Collect(rows, ScanInt)
		},
		Table:               `"m_migration"`,
		Columns:             `(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL DEFAULT 0)`,
		Placeholder:         func(n int) string { return "?" + strconv.Itoa(n) },
		OneStatementPerCall: true,
	}, ms)
	if err != nil {
		return err
	}
	return tx.Commit()
}

func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func tables(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	names, err := Collect(rows, ScanString)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, ",")
}

// ApplyMigrations runs what is missing and records it; run again, it runs nothing
// (the migrations here would fail if they ran twice), and a migration
// added later is the only one it runs.
func TestApplyMigrationsRunsWhatIsMissing(t *testing.T) {
	db := openSQLite(t)
	ms := []once.Migration{
		{Version: 1, Name: "a", SQL: "CREATE TABLE a (x INTEGER);\nCREATE TABLE b (y INTEGER);"},
		{Version: 2, Name: "c", SQL: "CREATE TABLE c (z INTEGER);"},
	}
	for range 2 {
		if err := sqliteTx(t, db, ms); err != nil {
			t.Fatal(err)
		}
	}
	if got := tables(t, db); got != "a,b,c,m_migration" {
		t.Fatalf("tables = %s", got)
	}
	ms = append(ms, once.Migration{Version: 3, Name: "d", SQL: "CREATE TABLE d (w INTEGER);"})
	if err := sqliteTx(t, db, ms); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT version FROM m_migration ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	vs, err := Collect(rows, ScanInt)
	if err != nil || len(vs) != 3 || vs[0] != 1 || vs[2] != 3 {
		t.Fatalf("recorded versions %v, %v; want 1, 2, 3", vs, err)
	}
}

// A failing statement is named with its migration, and the rollback
// leaves nothing of the migration, nor of those before it in the same
// transaction.
func TestApplyMigrationsNamesTheFailure(t *testing.T) {
	db := openSQLite(t)
	ms := []once.Migration{
		{Version: 1, Name: "good", SQL: "CREATE TABLE a (x INTEGER);"},
		{Version: 2, Name: "bad", SQL: "CREATE TABLE b (y INTEGER);\nCREATE TABLE oops (;"},
	}
	err := sqliteTx(t, db, ms)
	if err == nil || !strings.Contains(err.Error(), "migration 002_bad") || !strings.Contains(err.Error(), "CREATE TABLE oops") {
		t.Fatalf("ApplyMigrations = %v, want an error naming migration 002_bad and its statement", err)
	}
	if got := tables(t, db); got != "" {
		t.Fatalf("a failed ApplyMigrations left tables %s", got)
	}
}

// ApplyMigrations refuses, under the store's lock and before running anything, a
// schema a newer build migrated and one whose record has a gap.
func TestApplyMigrationsRefusesNewerOrGappedSchema(t *testing.T) {
	ms := []once.Migration{
		{Version: 1, Name: "a", SQL: "CREATE TABLE a (x INTEGER);"},
		{Version: 2, Name: "b", SQL: "CREATE TABLE b (y INTEGER);"},
	}
	for _, tc := range []struct {
		recorded string
		want     string
	}{
		{"(1, 'a'), (2, 'b'), (3, 'c')", "the schema is at version 3, this once knows up to 2; upgrade once"},
		{"(2, 'b')", "the schema records version 2 but lacks version 1"},
	} {
		db := openSQLite(t)
		if _, err := db.Exec(`CREATE TABLE m_migration (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL DEFAULT 0);
			INSERT INTO m_migration (version, name) VALUES ` + tc.recorded); err != nil {
			t.Fatal(err)
		}
		if err := sqliteTx(t, db, ms); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ApplyMigrations over versions %s = %v; want %q", tc.recorded, err, tc.want)
		}
		if got := tables(t, db); got != "m_migration" {
			t.Errorf("ApplyMigrations over versions %s left tables %s", tc.recorded, got)
		}
	}
}

var names = Names{Schema: "s", Prefix: "p_", Quote: func(s string) string { return `"` + s + `"` }}

func TestLoadMigrationsRendersInOrder(t *testing.T) {
	fsys := fstest.MapFS{
		"m/002_more.sql":   {Data: []byte(`ALTER TABLE {{.Table "action"}} ADD x int;`)},
		"m/001_action.sql": {Data: []byte(`CREATE TABLE {{.Table "action"}} (k text); CREATE INDEX {{.Index "a"}} ON {{.Table "action"}} (k);`)},
		"m/README":         {Data: []byte("not a migration")},
	}
	ms, err := LoadMigrations(fsys, "m", names)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Version != 1 || ms[1].Name != "more" {
		t.Fatalf("loaded %+v", ms)
	}
	if !strings.Contains(ms[0].SQL, `CREATE TABLE "s"."p_action"`) || !strings.Contains(ms[0].SQL, `INDEX "p_a_idx"`) {
		t.Fatalf("rendered %q", ms[0].SQL)
	}
}

func TestLoadMigrationsRefusesGaps(t *testing.T) {
	fsys := fstest.MapFS{
		"m/001_a.sql": {Data: []byte(`SELECT 1;`)},
		"m/003_c.sql": {Data: []byte(`SELECT 3;`)},
	}
	if _, err := LoadMigrations(fsys, "m", names); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("LoadMigrations with a gap = %v", err)
	}
	bad := fstest.MapFS{"m/001_a.sql": {Data: []byte(`{{.Nope}}`)}}
	if _, err := LoadMigrations(bad, "m", names); err == nil {
		t.Fatal("a template naming an unknown field was accepted")
	}
}

func TestStatements(t *testing.T) {
	got := Statements("-- comment\nCREATE TABLE a (\n  x int\n);\n\nCREATE INDEX b ON a (x);\nSELECT 1")
	if len(got) != 3 || !strings.HasPrefix(got[0], "CREATE TABLE a") || got[2] != "SELECT 1" {
		t.Fatalf("Statements = %q", got)
	}
}

func TestCheckIdent(t *testing.T) {
	for _, ok := range []string{"once_", "public", "_x9"} {
		if err := CheckIdent("f", ok, false); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "9a", `a"b`, "a b", "a;drop", strings.Repeat("a", 41)} {
		if err := CheckIdent("Config.Prefix", bad, false); err == nil || !strings.Contains(err.Error(), "Config.Prefix") {
			t.Errorf("%q accepted or unnamed: %v", bad, err)
		}
	}
	if err := CheckIdent("f", "", true); err != nil {
		t.Error(err)
	}
}

// A file that is meant as a migration but misses the NNN_name.sql form
// (a hyphen, a capital, two digits) is refused, not passed over: as the
// newest it leaves no gap, and the schema would lack it without a word.
func TestLoadMigrationsRefusesAMisnamedMigration(t *testing.T) {
	for _, file := range []string{"002_add-index.sql", "002_Add.sql", "02_add.sql", "0002_add.sql"} {
		fsys := fstest.MapFS{
			"m/001_a.sql": {Data: []byte(`SELECT 1;`)},
			"m/" + file:   {Data: []byte(`SELECT 2;`)},
			"m/README":    {Data: []byte("not a migration")},
		}
		if ms, err := LoadMigrations(fsys, "m", names); err == nil || !strings.Contains(err.Error(), file) {
			t.Errorf("LoadMigrations beside %s = %d migrations, %v; want it refused, by name", file, len(ms), err)
		}
	}
}
