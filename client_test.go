package once_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/storetest"
)

// The engine's tests live with the engine: the client layer of storetest
// runs here over SQLite (a database file per test, no server), worker
// processes and DoTx included, and the store packages run it again over
// their own stores.

func TestMain(m *testing.M) {
	// Worker processes of the suite are this test binary, started again.
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

// TestClient runs the client suite over SQLite.
func TestClient(t *testing.T) { storetest.RunClient(t, testdb.SQLite()) }
