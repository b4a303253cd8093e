package migrate

import (
	"context"
	"fmt"
	"strings"
)

// Tx is a store's migration transaction and the little of its SQL dialect
// that Apply needs. The store opens the transaction and takes its lock
// (PostgreSQL's advisory lock, SQLite's BEGIN IMMEDIATE) before Apply, and
// commits after, so concurrent migrators take turns and the second finds
// every version recorded by the first.
type Tx struct {
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

// Apply creates the migration table if it does not exist, reads the
// versions it records, refuses a schema Check refuses, and runs every
// migration of ms that it lacks, in order, recording each in the same
// transaction as its change. It returns the migrations it ran, none when
// another migrator ran them first. A failed migration returns an error
// naming it; the store's rollback then leaves nothing behind.
func Apply(ctx context.Context, tx Tx, ms []Migration) ([]Migration, error) {
	if err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+tx.Table+` `+tx.Columns); err != nil {
		return nil, fmt.Errorf("creating the migration table %s: %w", tx.Table, err)
	}
	versions, err := tx.Ints(ctx, `SELECT version FROM `+tx.Table)
	if err != nil {
		return nil, fmt.Errorf("reading the migration table %s: %w", tx.Table, err)
	}
	if err := Check(versions, len(ms)); err != nil {
		return nil, err
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	record := `INSERT INTO ` + tx.Table + ` (version, name) VALUES (` + tx.Placeholder(1) + `, ` + tx.Placeholder(2) + `)`
	var ran []Migration
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		if err := run(ctx, tx, m); err != nil {
			return nil, err
		}
		if err := tx.Exec(ctx, record, m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("migration %03d_%s: recording it: %w", m.Version, m.Name, err)
		}
		ran = append(ran, m)
	}
	return ran, nil
}

// Check refuses the versions a migration table records unless they are
// 1, 2, 3… up to at most known, the newest migration this build has. A
// newer schema was made by a newer once, whose rows this one may misread
// or write wrongly; a gap means the table was edited by hand, and
// applying the missing migration over what is there could fail halfway
// or do harm.
func Check(versions []int, known int) error {
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

// run runs one migration's SQL.
func run(ctx context.Context, tx Tx, m Migration) error {
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
