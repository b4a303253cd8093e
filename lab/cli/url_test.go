package cli_test

import (
	"strings"
	"testing"

	"github.com/oncehq/once/internal/testdb"
)

// TestPasswordNotEchoed: a password in the database URL, as user:pass@
// or as a password= parameter, appears in no message the command prints.
func TestPasswordNotEchoed(t *testing.T) {
	testdb.RequirePostgres(t)
	const secret = "s3cret-Pw"
	for _, url := range []string{
		"postgres://postgres:" + secret + "@127.0.0.1:5432/test?sslmode=disable&once_schema=once_cli_nothing_here",
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable&password=" + secret + "&once_schema=once_cli_nothing_here",
		"postgres://postgres:" + secret + "@127.0.0.1:1/test?connect_timeout=5",
		"postgres://postgres:" + secret + "@127.0.0.1:5432/test?sslmode=disable&once_schema=a%3Bb",
	} {
		for _, args := range [][]string{{"ls"}, {"reap"}, {"show", "abcdef01"}} {
			code, out, errOut := run(t, append(args, "--db", url)...)
			if code == 0 || errOut == "" {
				t.Errorf("once %s --db %s: exit %d, stderr %q; want an error", args[0], url, code, errOut)
			}
			if strings.Contains(out+errOut, secret) {
				t.Errorf("once %s --db %s printed the password:\n%s%s", args[0], url, out, errOut)
			}
		}
	}
	// The hint to migrate still names the URL, with the password elided.
	_, _, errOut := run(t, "ls", "--db", "postgres://postgres:"+secret+"@127.0.0.1:5432/test?sslmode=disable&once_schema=once_cli_nothing_here")
	if !strings.Contains(errOut, "once migrate --db postgres://postgres:…@127.0.0.1:5432/test") {
		t.Errorf("the migrate hint does not name the redacted URL: %s", errOut)
	}
}

// TestBadURLQuery: a once_schema or once_prefix the store cannot use, and
// a query that does not parse, are one-line errors saying what to fix,
// not a silent fall back to the public schema.
func TestBadURLQuery(t *testing.T) {
	url := testdb.RequirePostgres(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for _, tc := range []struct{ query, want string }{
		{"once_schema=a;b", "query does not parse (invalid semicolon"},
		{"once_schema=a%3Bb", `once_schema "a;b" must be 1 to 40 letters`},
		{"once_prefix=x-y", `once_prefix "x-y" must be 1 to 40 letters`},
		{"once_schema=%zz", "query"},
	} {
		for _, cmd := range []string{"ls", "migrate"} {
			code, out, errOut := run(t, cmd, "--db", url+sep+tc.query)
			if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
				t.Errorf("once %s --db …%s: exit %d, stdout %q, stderr %q; want one line with %q", cmd, tc.query, code, out, errOut, tc.want)
			}
		}
	}
}
