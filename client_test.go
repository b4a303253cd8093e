package once_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/sqlite"
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

// newClient returns a client over a migrated SQLite file of the test's
// own, and the store, for tests that arrange or inspect rows directly.
func newClient(t *testing.T, cfg once.Config) (*once.Client, *sqlite.Store) {
	t.Helper()
	return testdb.SQLiteClient(t, cfg)
}

// deadClaim leaves an action claimed by a worker that is gone: a claim
// whose lease has lapsed by the database's clock.
func deadClaim(t *testing.T, s once.Store, in once.Intent) once.Key {
	t.Helper()
	k, fp, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	cr, err := s.Claim(context.Background(), once.ClaimRequest{Key: k, Fingerprint: fp, Run: in.Run, Step: in.Step, Kind: in.Kind, Target: in.Target, Lease: time.Millisecond})
	if err != nil || !cr.Claimed {
		t.Fatalf("claim: %+v, %v", cr, err)
	}
	time.Sleep(20 * time.Millisecond)
	return k
}

func mustKey(t *testing.T, in once.Intent) once.Key {
	t.Helper()
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
