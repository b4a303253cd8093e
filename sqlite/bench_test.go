package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/storetest"
)

// BenchmarkDo: claim+complete and replay on an SQLite file with
// synchronous=FULL.
func BenchmarkDo(b *testing.B) {
	s, _ := testdb.NewSQLite(b)
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	storetest.Benchmark(b, s)
}

// BenchmarkNewKey: Do on a new key each time, which claims and records a
// success, beside the same two writes by hand on a file opened alike
// (Raw: an insert and an update, each its own commit, one writer at a
// time, as once bench's sqlite_raw does), by 1 and by 16 goroutines.
// Compare the arms' ns/op in one run.
func BenchmarkNewKey(b *testing.B) {
	ctx := context.Background()
	effect := func(context.Context, once.Attempt) (string, error) { return "msg-id-0123456789", nil }
	for _, workers := range []int{1, 16} {
		b.Run(fmt.Sprintf("Do/workers=%d", workers), func(b *testing.B) {
			c, _ := testdb.SQLiteClient(b, once.Config{})
			var n atomic.Int64
			parallel(b, workers, func() error {
				in := once.Intent{Run: "bench", Step: n.Add(1), Kind: "send_email", Target: "ada@example.com", Payload: "hello"}
				_, err := once.Do(ctx, c, in, effect)
				return err
			})
		})
		b.Run(fmt.Sprintf("Raw/workers=%d", workers), func(b *testing.B) {
			s, path := testdb.NewSQLite(b)
			db, err := sql.Open("sqlite", filepath.Join(filepath.Dir(path), "raw.db")+
				"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_txlock=immediate")
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			s.Close()
			const now = `CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)`
			if _, err := db.ExecContext(ctx, `CREATE TABLE raw_action (key TEXT NOT NULL PRIMARY KEY, status TEXT NOT NULL, result TEXT,
    created_at INTEGER NOT NULL DEFAULT (`+now+`), updated_at INTEGER NOT NULL DEFAULT (`+now+`)) STRICT`); err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var n atomic.Int64
			parallel(b, workers, func() error {
				key := fmt.Sprintf("%064x", n.Add(1))
				mu.Lock()
				_, err := db.ExecContext(ctx, `INSERT INTO raw_action (key, status) VALUES (?, 'in_flight') ON CONFLICT (key) DO NOTHING`, key)
				mu.Unlock()
				if err != nil {
					return err
				}
				mu.Lock()
				_, err = db.ExecContext(ctx, `UPDATE raw_action SET status = 'succeeded', result = ?, updated_at = `+now+` WHERE key = ?`, `"msg-id-0123456789"`, key)
				mu.Unlock()
				return err
			})
		})
	}
}

// parallel runs op b.N times over workers goroutines.
func parallel(b *testing.B, workers int, op func() error) {
	b.ReportAllocs()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := op(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
