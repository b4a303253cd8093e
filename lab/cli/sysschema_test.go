package cli_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once/internal/testdb"
)

// TestMigrateRefusesSystemSchema: once_schema naming one of PostgreSQL's
// own schemas is refused before anything is written; information_schema
// was migrated into.
func TestMigrateRefusesSystemSchema(t *testing.T) {
	url := testdb.RequirePostgres(t)
	var b [4]byte
	rand.Read(b[:])
	prefix := "t" + hex.EncodeToString(b[:]) + "_"
	t.Cleanup(func() {
		// What a migration into a system schema left, if one ran.
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		rows, _ := conn.Query(context.Background(), `SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables WHERE tablename LIKE $1`, prefix+"%")
		tables, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, tb := range tables {
			conn.Exec(context.Background(), `DROP TABLE IF EXISTS `+tb+` CASCADE`)
		}
		// And the schemas it made, which are another case of a system
		// schema's name (dropped only if empty).
		conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS "Information_Schema", "PG_CATALOG"`)
	})
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for _, schema := range []string{"information_schema", "pg_catalog", "pg_toast", "pg_temp_1", "Information_Schema", "PG_CATALOG"} {
		for _, args := range [][]string{{"migrate"}, {"migrate", "--print"}, {"ls"}} {
			db := url + sep + "once_schema=" + schema + "&once_prefix=" + prefix
			code, _, stderr := run(t, append(args, "--db", db)...)
			if code != 1 || !strings.Contains(stderr, "is a system schema") {
				t.Errorf("once %s with once_schema=%s: exit %d, %q; want it refused as a system schema", strings.Join(args, " "), schema, code, stderr)
			}
		}
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE tablename LIKE $1`, prefix+"%").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n > 0 {
		t.Errorf("%d tables were created in system schemas", n)
	}
}
