package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncehq/once/internal/testdb"
)

// TestAdversaryKeywordDSNBecomesSQLiteFile: libpq's keyword/value form,
// which pgx accepts and operators paste from other tools, is not a
// postgres:// URL, so the command takes it for a SQLite file path.
// `once migrate` then creates a SQLite file named after the whole
// connection string, password included, reports success on stdout
// (which Run does not redact) with the password in clear, and `once ls`
// on the same string answers "no actions match": the operator believes
// PostgreSQL was migrated and is empty.
func TestAdversaryKeywordDSNBecomesSQLiteFile(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	const secret = "S3CRETpw"
	dsn := "host=127.0.0.1 user=postgres password=" + secret + " dbname=test"
	code, out, errOut := run(t, "migrate", "--db", dsn)
	if code == 0 {
		t.Errorf("once migrate --db %q: exit 0, stdout %q; want a refusal naming the keyword/value form (use postgres://…)", dsn, out)
	}
	if strings.Contains(out+errOut, secret) {
		t.Errorf("once migrate --db %q printed the password:\n%s%s", dsn, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, dsn)); err == nil {
		t.Errorf("once migrate created a SQLite file named after the connection string, password included: %s", filepath.Join(dir, dsn))
	}
}

// TestAdversaryRedactionMisses: forms of a database URL whose password
// dburl.Redact does not find, each printed by a command's error:
//   - a password holding an unencoded '@' (url.Parse and pgx take the
//     last '@' as the end of the user info, and connect): Redact stops at
//     the first '@' and prints the rest of the password;
//   - sslpassword=, pgx's password for the client key, which the
//     \bpassword= pattern does not match;
//   - postgres:/ with one slash missing, which is taken for a SQLite
//     path and quoted whole.
func TestAdversaryRedactionMisses(t *testing.T) {
	testdb.RequirePostgres(t)
	t.Chdir(t.TempDir())
	for _, tc := range []struct{ url, secret string }{
		{"postgres://postgres:S3C@RETpw@127.0.0.1:5432/test?sslmode=disable&once_schema=once_adv_nothing_here", "RETpw"},
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable&sslpassword=S3CRETpw&once_schema=once_adv_nothing_here", "S3CRETpw"},
		{"postgres:/postgres:S3CRETpw@127.0.0.1:5432/test", "S3CRETpw"},
	} {
		code, out, errOut := run(t, "ls", "--db", tc.url)
		if code == 0 {
			t.Errorf("once ls --db %s: exit 0; want an error", tc.url)
		}
		if strings.Contains(out+errOut, tc.secret) {
			t.Errorf("once ls --db %s printed (part of) the password %q:\n%s%s", tc.url, tc.secret, out, errOut)
		}
	}
}
