package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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
		Faults:   sqliteFaults,
		Features: storetest.Features{Processes: true},
	}
}

// SQLiteUnbatched is SQLite with group commit off (Config.Unbatched):
// every claim and outcome a transaction of its own, worker processes'
// too.
func SQLiteUnbatched() storetest.Harness {
	h := SQLite()
	h.New = func(t *testing.T) (once.Store, string) {
		s, path := newSQLiteWith(t, sqlite.Config{Unbatched: true})
		return s, unbatchedSpec + path
	}
	return h
}

// unbatchedSpec starts the spec of a store opened with
// Config.Unbatched; the path follows it.
const unbatchedSpec = "unbatched:"

// sqliteSpec reads a harness's spec: the file's path, and the config.
func sqliteSpec(spec string) (string, sqlite.Config) {
	if path, ok := strings.CutPrefix(spec, unbatchedSpec); ok {
		return path, sqlite.Config{Unbatched: true}
	}
	return spec, sqlite.Config{}
}

// OpenSQLite opens the database file a spec names, as the spec says;
// worker processes call it from storetest.MaybeChild.
func OpenSQLite(_ context.Context, spec string) (once.Store, error) {
	path, cfg := sqliteSpec(spec)
	return sqlite.Open(path, cfg)
}

// NewSQLite opens a new, not yet migrated database file in the test's
// temporary directory, closed when the test ends.
func NewSQLite(t testing.TB) (*sqlite.Store, string) {
	t.Helper()
	return newSQLiteWith(t, sqlite.Config{})
}

// newSQLiteWith is NewSQLite with cfg.
func newSQLiteWith(t testing.TB, cfg sqlite.Config) (*sqlite.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "once.db")
	s, err := sqlite.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// SQLiteClient returns a client over a new, migrated SQLite store in
// the test's temporary directory, made with cfg (its Store is set here),
// and the store. Both are closed when the test ends.
func SQLiteClient(t testing.TB, cfg once.Config) (*once.Client, *sqlite.Store) {
	t.Helper()
	s, _ := NewSQLite(t)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg.Store = s
	c, err := once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, s
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

// sqliteFaults gives the partial-failure tests a second store on the
// file. SQLite runs in the process, so there is no reply to lose and no
// connection to refuse; what can hang is the file's write lock, held by
// another connection (as a process stopped inside a write would hold it).
// It holds up every store on the file, not only the faulted one.
func sqliteFaults(t *testing.T, spec string) (once.Store, storetest.Faults) {
	t.Helper()
	path, cfg := sqliteSpec(spec)
	s, err := sqlite.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &lockFaults{t: t, db: db}
	t.Cleanup(func() {
		f.Hang(false)
		db.Close()
	})
	return s, f
}

// lockFaults hangs a SQLite file by holding its write lock.
type lockFaults struct {
	t    *testing.T
	db   *sql.DB
	mu   sync.Mutex
	held *sql.Conn
}

func (f *lockFaults) Hang(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case on && f.held == nil:
		conn, err := f.writeLock(context.Background())
		if err != nil {
			f.t.Errorf("hang: %v", err)
			return
		}
		f.held = conn
	case !on && f.held != nil:
		f.held.ExecContext(context.Background(), `ROLLBACK`)
		f.held.Close()
		f.held = nil
	}
}

// writeLock takes the file's write lock on a connection of its own.
func (f *lockFaults) writeLock(ctx context.Context) (*sql.Conn, error) {
	conn, err := f.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	// The lock may be taken for a moment by a writer; wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = conn.ExecContext(ctx, `BEGIN IMMEDIATE`)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("could not take the write lock: %w", err)
	}
	return conn, nil
}

// Lock holds the file's write lock, the only lock SQLite has: every
// write waits, not only the row's.
func (f *lockFaults) Lock(ctx context.Context, _ once.Key) (func() error, error) {
	conn, err := f.writeLock(ctx)
	if err != nil {
		return nil, err
	}
	return func() error {
		defer conn.Close()
		_, err := conn.ExecContext(context.Background(), `ROLLBACK`)
		return err
	}, nil
}

func (f *lockFaults) Refuse(bool) { f.t.Fatal("sqlite: no connection to refuse") }

func (f *lockFaults) End() { f.t.Fatal("sqlite: no connection to end") }

func (f *lockFaults) LoseReply(string, bool) <-chan struct{} {
	f.t.Fatal("sqlite: no reply to lose")
	return nil
}
