package bench

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
)

// sqliteParams are the sqlite store's connection parameters (see
// sqlite.Open): WAL, synchronous=FULL, a 10s busy timeout, foreign keys,
// BEGIN IMMEDIATE. The raw file is opened with the same, and openSQLite
// checks that both files report the same pragmas, so the raw arm is not
// faster for syncing less.
var sqliteParams = "_pragma=busy_timeout(" + strconv.FormatInt((10*time.Second).Milliseconds(), 10) + ")" +
	"&_pragma=journal_mode(WAL)" +
	"&_pragma=synchronous(FULL)" +
	"&_pragma=foreign_keys(1)" +
	"&_txlock=immediate"

// sqlitePragmas are the pragmas compared between the two files.
var sqlitePragmas = []string{"journal_mode", "synchronous", "busy_timeout", "foreign_keys"}

// sqliteRaw is sqlite_raw's file: the raw table on its own, beside the
// store's file in the run's directory.
type sqliteRaw struct {
	db *sql.DB
	// mu admits one write at a time, as the store does: SQLite has one
	// write lock per file, and writers that poll for it under the busy
	// timeout (sleeping up to 100ms between tries) starve each other.
	mu             sync.Mutex
	insert, update string
}

// openSQLite makes the run's directory, the store's files (with group
// commit and without) and the raw file.
func (r *runner) openSQLite(ctx context.Context) error {
	r.setupNote("SQLite files")
	dir, err := os.MkdirTemp("", "once-bench-")
	if err != nil {
		return err
	}
	r.dir = dir
	r.defer_(func() {
		if !r.opts.Keep {
			os.RemoveAll(dir)
		}
	})
	if r.sqliteStore, err = sqlite.Open(filepath.Join(dir, "once.db"), sqlite.Config{}); err != nil {
		return err
	}
	r.defer_(func() { r.sqliteStore.Close() })
	if err := r.sqliteStore.Migrate(ctx); err != nil {
		return err
	}
	if r.sqliteDo, err = once.New(once.Config{Store: r.sqliteStore}); err != nil {
		return err
	}
	if r.has(ArmSQLiteProtocol) {
		if r.sqliteProtocol, err = r.serveProtocol(r.sqliteDo); err != nil {
			return err
		}
	}
	unbatched, err := sqlite.Open(filepath.Join(dir, "once-unbatched.db"), sqlite.Config{Unbatched: true})
	if err != nil {
		return err
	}
	r.defer_(func() { unbatched.Close() })
	if err := unbatched.Migrate(ctx); err != nil {
		return err
	}
	if r.sqliteDoUnbatched, err = once.New(once.Config{Store: unbatched}); err != nil {
		return err
	}
	db, err := sql.Open("sqlite", filepath.Join(dir, "raw.db")+"?"+sqliteParams)
	if err != nil {
		return err
	}
	r.defer_(func() { db.Close() })
	const now = `CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)`
	if _, err := db.ExecContext(ctx, `CREATE TABLE raw_action (
    key        TEXT    NOT NULL PRIMARY KEY,
    status     TEXT    NOT NULL,
    result     TEXT,
    created_at INTEGER NOT NULL DEFAULT (`+now+`),
    updated_at INTEGER NOT NULL DEFAULT (`+now+`)
) STRICT`); err != nil {
		return fmt.Errorf("creating the raw SQLite table: %w", err)
	}
	for _, p := range sqlitePragmas {
		var store, raw string
		if err := r.sqliteStore.DB().QueryRowContext(ctx, `PRAGMA `+p).Scan(&store); err != nil {
			return err
		}
		if err := db.QueryRowContext(ctx, `PRAGMA `+p).Scan(&raw); err != nil {
			return err
		}
		if store != raw {
			return fmt.Errorf("the raw SQLite file has %s %s and the store's %s; open it with the store's parameters", p, raw, store)
		}
	}
	r.sqliteRaw = &sqliteRaw{
		db:     db,
		insert: `INSERT INTO raw_action (key, status) VALUES (?, 'in_flight') ON CONFLICT (key) DO NOTHING`,
		update: `UPDATE raw_action SET status = 'succeeded', result = ?, updated_at = ` + now + ` WHERE key = ?`,
	}
	return nil
}

// worker is the seed's two statements on the raw SQLite file, each its
// own commit.
func (s *sqliteRaw) worker(rng *rand.Rand) work {
	return func(ctx context.Context) (int, error) {
		key := randomKey(rng)
		s.mu.Lock()
		_, err := s.db.ExecContext(ctx, s.insert, key)
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
		s.mu.Lock()
		res, err := s.db.ExecContext(ctx, s.update, resultJSON, key)
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return 0, fmt.Errorf("the update of %s changed %d rows, not 1", key, n)
		}
		return 1, nil
	}
}
