package storekit

import (
	"bytes"
	"context"
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

// Constraint is a constraint's name: Prefix and name, quoted. PostgreSQL
// names a column's unnamed check table_column_check, which Constraint
// of "action_status_check" is for the action table.
func (n Names) Constraint(name string) string { return n.Quote(n.Prefix + name) }

var fileRE = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.sql$`)

// meantRE is a file meant as a migration: SQL whose name starts with a
// digit. One that fileRE does not take is an error, not passed over.
var meantRE = regexp.MustCompile(`^\d.*\.sql$`)

// LoadMigrations reads every NNN_name.sql file in dir of fsys, in version order,
// and renders it with names. Versions must be 1, 2, 3… with no gaps, so a
// missing file is caught at build time by the tests, not in production.
// Other files are passed over, but an .sql file whose name starts with a
// digit in another form (02_x.sql, 002_add-x.sql) is an error.
func LoadMigrations(fsys fs.FS, dir string, names Names) ([]once.Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []once.Migration
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			if meantRE.MatchString(e.Name()) {
				return nil, fmt.Errorf("migration %s: name it NNN_name.sql, three digits and lowercase letters, digits or underscores", e.Name())
			}
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
		out = append(out, once.Migration{Version: v, Name: m[2], SQL: buf.String()})
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

// MigrationTx is a store's migration transaction and the little of its SQL dialect
// that ApplyMigrations needs. The store opens the transaction and takes its lock
// (PostgreSQL's advisory lock, SQLite's BEGIN IMMEDIATE) before ApplyMigrations, and
// commits after, so concurrent migrators take turns and the second finds
// every version recorded by the first.
type MigrationTx struct {
	// Exec runs one statement, with its arguments, in the transaction.
	Exec func(ctx context.Context, sql string, args ...any) error
	// Ints runs a query whose rows are one integer each, in the
	// transaction.
	Ints func(ctx context.Context, sql string) ([]int, error)
	// Table is the migration table's name, quoted and qualified
	// (Names.Table("migration")).
	Table string
	// Columns is what follows the table's name in its CREATE TABLE, in
	// the dialect: the columns version (the primary key), name and
	// applied_at (defaulting to the database's now), and any table
	// options.
	Columns string
	// Placeholder spells the n-th parameter of a statement ($1, ?1).
	Placeholder func(n int) string
	// OneStatementPerCall runs each migration a statement at a time (see
	// Statements), for drivers that run one statement per call. A failure
	// then names its statement.
	OneStatementPerCall bool
}

// ApplyMigrations creates the migration table if it does not exist, reads the
// versions it records, refuses a schema CheckVersions refuses, and runs every
// migration of ms that it lacks, in order, recording each in the same
// transaction as its change. It returns the migrations it ran, none when
// another migrator ran them first. A failed migration returns an error
// naming it; the store's rollback then leaves nothing behind.
func ApplyMigrations(ctx context.Context, tx MigrationTx, ms []once.Migration) ([]once.Migration, error) {
	if err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+tx.Table+` `+tx.Columns); err != nil {
		return nil, fmt.Errorf("creating the migration table %s: %w", tx.Table, err)
	}
	versions, err := tx.Ints(ctx, `SELECT version FROM `+tx.Table)
	if err != nil {
		return nil, fmt.Errorf("reading the migration table %s: %w", tx.Table, err)
	}
	if err := CheckVersions(versions, len(ms)); err != nil {
		return nil, err
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	record := `INSERT INTO ` + tx.Table + ` (version, name) VALUES (` + tx.Placeholder(1) + `, ` + tx.Placeholder(2) + `)`
	var ran []once.Migration
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		if err := runMigration(ctx, tx, m); err != nil {
			return nil, err
		}
		if err := tx.Exec(ctx, record, m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("migration %03d_%s: recording it: %w", m.Version, m.Name, err)
		}
		ran = append(ran, m)
	}
	return ran, nil
}

// CheckVersions refuses the versions a migration table records unless they are
// 1, 2, 3… up to at most known, the newest migration this build has. A
// newer schema was made by a newer once, whose rows this one may misread
// or write wrongly; a gap means the table was edited by hand, and
// applying the missing migration over what is there could fail halfway
// or do harm.
func CheckVersions(versions []int, known int) error {
	newest := 0
	have := make(map[int]bool, len(versions))
	for _, v := range versions {
		have[v] = true
		newest = max(newest, v)
	}
	if newest > known {
		return fmt.Errorf("the schema is at version %d, this once knows up to %d; upgrade once", newest, known)
	}
	for v := 1; v < newest; v++ {
		if !have[v] {
			return fmt.Errorf("the schema records version %d but lacks version %d, so its migration table was edited by hand; restore it (or the database) from a backup", newest, v)
		}
	}
	return nil
}

// runMigration runs one migration's SQL.
func runMigration(ctx context.Context, tx MigrationTx, m once.Migration) error {
	if !tx.OneStatementPerCall {
		if err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("migration %03d_%s: %w", m.Version, m.Name, err)
		}
		return nil
	}
	for _, stmt := range Statements(m.SQL) {
		if err := tx.Exec(ctx, stmt); err != nil {
			head, _, _ := strings.Cut(stmt, "\n")
			return fmt.Errorf("migration %03d_%s, at %q: %w", m.Version, m.Name, head, err)
		}
	}
	return nil
}
