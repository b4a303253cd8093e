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

// TestPoolerURL: the command reaches the store through PgBouncer in
// transaction mode when the URL says so (once_pooler=transaction), and
// says what to add when it does not.
func TestPoolerURL(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{})
	var r [6]byte
	rand.Read(r[:])
	schema := "once_cli_" + hex.EncodeToString(r[:])
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), testdb.PostgresURL())
		if err == nil {
			conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			conn.Close(context.Background())
		}
	})
	db := b.URL + "&once_schema=" + schema

	code, out, errOut := run(t, "migrate", "--db", db)
	if code == 0 || !strings.Contains(errOut, "once_pooler=transaction") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("once migrate through PgBouncer, once_pooler not set: exit %d, stdout %q, stderr %q; want one line naming once_pooler=transaction", code, out, errOut)
	}
	mustRun(t, "migrate", "--db", db+"&once_pooler=transaction")
	if out := mustRun(t, "ls", "--db", db+"&once_pooler=transaction"); strings.Contains(out, "error") {
		t.Fatalf("once ls: %s", out)
	}
}

// TestBadPoolerInURL: a once_pooler the store does not know, or
// statement mode, is a one-line error saying what to use.
func TestBadPoolerInURL(t *testing.T) {
	url := testdb.RequirePostgres(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for _, tc := range []struct{ query, want string }{
		{"once_pooler=statement", "allows no transaction"},
		{"once_pooler=yes", `pooler mode "yes" is not one the store knows; use "none", "session" or "transaction"`},
	} {
		code, out, errOut := run(t, "ls", "--db", url+sep+tc.query)
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("once ls --db …%s: exit %d, stdout %q, stderr %q; want one line with %q", tc.query, code, out, errOut, tc.want)
		}
	}
}
