package sqlite_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/storetest"
)

func TestMain(m *testing.M) {
	maybeGroupChild()
	maybeDiskFullChild()
	storetest.MaybeChild(testdb.OpenSQLite)
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestStore runs the Store contract on a database file per test.
func TestStore(t *testing.T) { storetest.RunStore(t, testdb.SQLite()) }

// TestClient runs the engine over the sqlite store, DoTx included.
func TestClient(t *testing.T) { storetest.RunClient(t, testdb.SQLite()) }

// TestStoreUnbatched runs the Store contract with group commit off.
func TestStoreUnbatched(t *testing.T) { storetest.RunStore(t, testdb.SQLiteUnbatched()) }

// TestClientUnbatched runs the engine over the store with group commit
// off.
func TestClientUnbatched(t *testing.T) { storetest.RunClient(t, testdb.SQLiteUnbatched()) }
