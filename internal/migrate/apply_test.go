package migrate

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/oncehq/once/internal/sqlrows"
)

// sqliteTx runs Apply in a real SQLite transaction, the way the sqlite
// store does.
func sqliteTx(t *testing.T, db *sql.DB, ms []Migration) error {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = Apply(ctx, Tx{
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
			return sqlrows.Collect(rows, sqlrows.Int)
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
	names, err := sqlrows.Collect(rows, sqlrows.String)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, ",")
}

// Apply runs what is missing and records it; run again, it runs nothing
// (the migrations here would fail if they ran twice), and a migration
// added later is the only one it runs.
func TestApplyRunsWhatIsMissing(t *testing.T) {
	db := openSQLite(t)
	ms := []Migration{
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
	ms = append(ms, Migration{Version: 3, Name: "d", SQL: "CREATE TABLE d (w INTEGER);"})
	if err := sqliteTx(t, db, ms); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT version FROM m_migration ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	vs, err := sqlrows.Collect(rows, sqlrows.Int)
	if err != nil || len(vs) != 3 || vs[0] != 1 || vs[2] != 3 {
		t.Fatalf("recorded versions %v, %v; want 1, 2, 3", vs, err)
	}
}

// A failing statement is named with its migration, and the rollback
// leaves nothing of the migration, nor of those before it in the same
// transaction.
func TestApplyNamesTheFailure(t *testing.T) {
	db := openSQLite(t)
	ms := []Migration{
		{Version: 1, Name: "good", SQL: "CREATE TABLE a (x INTEGER);"},
		{Version: 2, Name: "bad", SQL: "CREATE TABLE b (y INTEGER);\nCREATE TABLE oops (;"},
	}
	err := sqliteTx(t, db, ms)
	if err == nil || !strings.Contains(err.Error(), "migration 002_bad") || !strings.Contains(err.Error(), "CREATE TABLE oops") {
		t.Fatalf("Apply = %v, want an error naming migration 002_bad and its statement", err)
	}
	if got := tables(t, db); got != "" {
		t.Fatalf("a failed Apply left tables %s", got)
	}
}

// Apply refuses, under the store's lock and before running anything, a
// schema a newer build migrated and one whose record has a gap.
func TestApplyRefusesNewerOrGappedSchema(t *testing.T) {
	ms := []Migration{
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
			t.Errorf("Apply over versions %s = %v; want %q", tc.recorded, err, tc.want)
		}
		if got := tables(t, db); got != "m_migration" {
			t.Errorf("Apply over versions %s left tables %s", tc.recorded, got)
		}
	}
}
