package storekit_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"testing/fstest"
	"time"

	_ "modernc.org/sqlite"

	"github.com/oncehq/once"
	"github.com/oncehq/once/storekit"
)

// A store keeps its schema as numbered SQL files, renders them for the
// user's table prefix, and applies the missing ones in a transaction
// that holds its own lock (here SQLite's BEGIN IMMEDIATE, on one
// connection). A second run applies nothing.
func ExampleApplyMigrations() {
	ctx := context.Background()
	files := fstest.MapFS{
		"migrations/001_action.sql": {Data: []byte(`CREATE TABLE {{.Table "action"}} (key TEXT PRIMARY KEY);`)},
		"migrations/002_lease.sql":  {Data: []byte(`CREATE INDEX {{.Index "action_key"}} ON {{.Table "action"}} (key);`)},
	}
	names := storekit.Names{Prefix: "app_", Quote: func(s string) string { return `"` + s + `"` }}
	ms, err := storekit.LoadMigrations(files, "migrations", names)
	if err != nil {
		panic(err)
	}
	db, err := sql.Open("sqlite", "file:example?mode=memory&cache=shared")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	migrate := func() []once.Migration {
		conn, err := db.Conn(ctx)
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
			panic(err)
		}
		ran, err := storekit.ApplyMigrations(ctx, storekit.MigrationTx{
			Exec: func(ctx context.Context, q string, args ...any) error {
				_, err := conn.ExecContext(ctx, q, args...)
				return err
			},
			Ints: func(ctx context.Context, q string) ([]int, error) {
				rows, err := conn.QueryContext(ctx, q)
				if err != nil {
					return nil, err
				}
				defer rows.Close()
				return storekit.Collect(rows, storekit.ScanInt)
			},
			Table:               names.Table("migration"),
			Columns:             `(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL DEFAULT (unixepoch()))`,
			Placeholder:         func(n int) string { return "?" + strconv.Itoa(n) },
			OneStatementPerCall: true,
		}, ms)
		if err != nil {
			conn.ExecContext(ctx, `ROLLBACK`)
			panic(err)
		}
		if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
			panic(err)
		}
		return ran
	}
	for _, m := range migrate() {
		fmt.Printf("%03d_%s: %s\n", m.Version, m.Name, m.SQL)
	}
	fmt.Println("again:", len(migrate()))
	// Output:
	// 001_action: CREATE TABLE "app_action" (key TEXT PRIMARY KEY);
	// 002_lease: CREATE INDEX "app_action_key_idx" ON "app_action" (key);
	// again: 0
}

// A first attempt that succeeded writes no event: its row tells it. A
// reader of the trail gets the claim and the outcome all the same.
func ExampleWithHappyPath() {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	row := once.Action{Key: "k1", Status: once.StatusSucceeded, Attempt: 1, CreatedAt: at, CompletedAt: at.Add(time.Second)}
	done := once.Transition{Key: row.Key, Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded,
		Event: once.Event{Type: once.EventSucceeded, From: once.StatusInFlight, Actor: once.ActorWorker}}
	fmt.Printf("the success writes %q\n", storekit.EventToWrite(done))
	for _, e := range storekit.WithHappyPath(row, "host:42", nil) {
		fmt.Println(e.At.Format(time.TimeOnly), e.Type, e.To, e.Origin)
	}
	// Output:
	// the success writes ""
	// 03:04:05 claimed in_flight host:42
	// 03:04:06 succeeded succeeded host:42
}
