package cli_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/sqlite"
)

// execMigrationTable runs stmt, in which %s stands for the migration
// table, on db as an operator would by hand.
func execMigrationTable(t *testing.T, db, stmt string) {
	t.Helper()
	ctx := context.Background()
	s, err := dburl.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	switch st := s.Store.(type) {
	case *sqlite.Store:
		_, err = st.DB().ExecContext(ctx, fmt.Sprintf(stmt, "once_migration"))
	case *postgres.Store:
		schema := strings.SplitN(strings.SplitN(db, "once_schema=", 2)[1], "&", 2)[0]
		_, err = st.Pool().Exec(ctx, fmt.Sprintf(stmt, pgx.Identifier{schema, "once_migration"}.Sanitize()))
	default:
		t.Fatalf("unknown store %T", s.Store)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestSchemaNewerThanBinary: a schema migrated by a newer once, or with a
// version missing from its record, is refused by every command that opens
// the database, in one line naming both versions, and migrate changes
// nothing.
func TestSchemaNewerThanBinary(t *testing.T) {
	for name, newDB := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			latest := latestMigration(t, name)
			commands := [][]string{
				{"migrate"}, {"ls"}, {"show", "abcdef01"}, {"reap"}, {"purge", "--dry-run"},
				{"resolve", "abcdef01", "--done", "--note", "checked"},
			}

			newer := newDB(t)
			mustRun(t, "migrate", "--db", newer)
			execMigrationTable(t, newer, fmt.Sprintf(`INSERT INTO %%s (version, name) VALUES (%d, 'from_the_future')`, latest+2))
			want := fmt.Sprintf("the schema is at version %d, this once knows up to %d; upgrade once", latest+2, latest)
			for _, args := range commands {
				code, out, errOut := run(t, append(args, "--db", newer)...)
				if code == 0 || !strings.Contains(errOut, want) || strings.Count(errOut, "\n") != 1 {
					t.Errorf("once %s on a newer schema: exit %d, stdout %q, stderr %q; want one line with %q", args[0], code, out, errOut, want)
				}
			}

			gap := newDB(t)
			mustRun(t, "migrate", "--db", gap)
			execMigrationTable(t, gap, `DELETE FROM %s WHERE version = 2`)
			for _, args := range commands {
				code, out, errOut := run(t, append(args, "--db", gap)...)
				if code == 0 || !strings.Contains(errOut, "lacks version 2") || strings.Count(errOut, "\n") != 1 {
					t.Errorf("once %s on a schema with a gap: exit %d, stdout %q, stderr %q; want one line saying it lacks version 2", args[0], code, out, errOut)
				}
			}
		})
	}
}
