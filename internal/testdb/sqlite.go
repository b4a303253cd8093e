package testdb

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
	"github.com/oncehq/once/storetest"
)

// SQLite is the storetest harness for the sqlite store: a database file
// in the test's temporary directory, whose path is the spec. The sqlite
// package runs both layers over it; the root package runs the client
// layer, so the engine is tested where it lives.
func SQLite() storetest.Harness {
	return storetest.Harness{
		New:      func(t *testing.T) (once.Store, string) { return NewSQLite(t) },
		Open:     OpenSQLite,
		Tx:       sqliteTx,
		Features: storetest.Features{Processes: true},
	}
}

// OpenSQLite opens the database file at path; worker processes call it
// from storetest.MaybeChild.
func OpenSQLite(_ context.Context, path string) (once.Store, error) {
	return sqlite.Open(path, sqlite.Config{})
}

// NewSQLite opens a new, not yet migrated database file in the test's
// temporary directory, closed when the test ends.
func NewSQLite(t testing.TB) (*sqlite.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "once.db")
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// sqliteTx gives the DoTx tests transactions on the store's database,
// and an application table in the same file for the effect to write.
func sqliteTx(t *testing.T, st once.Store, _ string) storetest.TxHarness {
	t.Helper()
	s := st.(*sqlite.Store)
	if _, err := s.DB().ExecContext(context.Background(), `CREATE TABLE outbox (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return storetest.TxOf(s, storetest.TxFuncs[*sql.Tx]{
		Begin:    func(ctx context.Context) (*sql.Tx, error) { return s.DB().BeginTx(ctx, nil) },
		Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
		Insert: func(ctx context.Context, tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO outbox (id) VALUES (?)`, id)
			return err
		},
		Count: func(ctx context.Context) (n int, err error) {
			return n, s.DB().QueryRowContext(ctx, `SELECT count(*) FROM outbox`).Scan(&n)
		},
	})
}
