// Package migrate reads a store's numbered SQL migrations, renders them
// for a schema and table prefix, and applies the ones a database lacks
// (Apply). The lock that keeps concurrent migrators apart, and the SQL
// dialect, are the store's business.
package migrate

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/oncehq/once"
)

// Migration is one numbered SQL file, rendered.
type Migration = once.Migration

// Names says how a store spells its objects. Templates use them as
// {{.Table "action"}} and {{.Index "action_lease"}}.
type Names struct {
	// Schema qualifies table names; empty leaves them unqualified.
	Schema string
	// Prefix starts every table and index name.
	Prefix string
	// Quote quotes one identifier the database's way.
	Quote func(string) string
}

// Table returns the qualified, quoted name of a table.
func (n Names) Table(name string) string {
	q := n.Quote(n.Prefix + name)
	if n.Schema != "" {
		q = n.Quote(n.Schema) + "." + q
	}
	return q
}

// Index returns the quoted name of an index.
func (n Names) Index(name string) string { return n.Quote(n.Prefix + name + "_idx") }

var fileRE = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.sql$`)

// Load reads every NNN_name.sql file in dir of fsys, in version order,
// and renders it with names. Versions must be 1, 2, 3… with no gaps, so a
// missing file is caught at build time by the tests, not in production.
func Load(fsys fs.FS, dir string, names Names) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.Atoi(m[1])
		raw, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(e.Name()).Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", e.Name(), err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, names); err != nil {
			return nil, fmt.Errorf("migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: m[2], SQL: buf.String()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrations: expected version %d, found %03d_%s", i+1, m.Version, m.Name)
		}
	}
	return out, nil
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckIdent reports whether s can be used, quoted, as part of an SQL
// identifier. Names are restricted to letters, digits and underscores so
// that no quoting rule of any database can be tripped.
func CheckIdent(field, s string, allowEmpty bool) error {
	if s == "" && allowEmpty {
		return nil
	}
	if len(s) > 40 || !identRE.MatchString(s) {
		return fmt.Errorf("%s %q must be 1 to 40 letters, digits or underscores, not starting with a digit", field, s)
	}
	return nil
}

// CheckSchema is CheckIdent for a PostgreSQL schema, which must also not
// be one of the server's own: information_schema, or a name starting
// with pg_ (pg_catalog, pg_toast, pg_temp_1), which PostgreSQL reserves.
// Migrating into them writes tables among the server's, or fails half
// way with a permission error. They are refused in any case: "PG_CATALOG"
// is another schema to the server, but no one means it.
func CheckSchema(field, s string, allowEmpty bool) error {
	if err := CheckIdent(field, s, allowEmpty); err != nil {
		return err
	}
	if l := strings.ToLower(s); l == "information_schema" || strings.HasPrefix(l, "pg_") {
		return fmt.Errorf("%s %q is a system schema of PostgreSQL (information_schema and names starting with pg_ are its own); name a schema of your own, or leave it empty for public", field, s)
	}
	return nil
}

// Statements splits a migration into statements at semicolons that end a
// line, for drivers that run one statement per call. Comment lines are
// dropped.
func Statements(sql string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// QualifiedIndex returns the index name qualified by the schema, for
// statements such as DROP INDEX that look indexes up by schema.
func (n Names) QualifiedIndex(name string) string {
	q := n.Index(name)
	if n.Schema != "" {
		q = n.Quote(n.Schema) + "." + q
	}
	return q
}
