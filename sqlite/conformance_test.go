package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/sqlite"
	"github.com/oncehq/once/storetest"
)

func TestMain(m *testing.M) {
	storetest.MaybeChild(openSpec)
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// A spec is the database file's path.
func openSpec(_ context.Context, path string) (once.Store, error) {
	return sqlite.Open(path, sqlite.Config{})
}

func newStore(t testing.TB) (once.Store, string) {
	path := filepath.Join(t.TempDir(), "once.db")
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{New: func(t *testing.T) (once.Store, string) { return newStore(t) }, Open: openSpec})
	t.Run("DoTx", func(t *testing.T) { t.Parallel(); testDoTx(t) })
	t.Run("DoTxRollback", func(t *testing.T) { t.Parallel(); testDoTxRollback(t) })
	t.Run("DoTxOtherStore", func(t *testing.T) { t.Parallel(); testDoTxOtherStore(t) })
}

func setup(t *testing.T) (*sqlite.Store, *once.Client) {
	st, _ := newStore(t)
	s := st.(*sqlite.Store)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE outbox (id TEXT PRIMARY KEY, body TEXT)`); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

var txIntent = once.Intent{Run: "r", Kind: "write_outbox", Target: "m-1", Payload: "hello"}

func countOutbox(t *testing.T, s *sqlite.Store) int {
	var n int
	if err := s.DB().QueryRow(`SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func testDoTx(t *testing.T) {
	s, c := setup(t)
	ctx := context.Background()
	for i := range 2 {
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := once.DoTx(ctx, c, s, tx, txIntent, func(ctx context.Context, tx *sql.Tx, a once.Attempt) (string, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO outbox (id, body) VALUES (?, ?)`, string(a.Key), "hello")
			return "written", err
		})
		if err != nil || res.Value != "written" || res.Replayed != (i == 1) {
			t.Fatalf("DoTx #%d = %+v, %v", i+1, res, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if n := countOutbox(t, s); n != 1 {
		t.Fatalf("outbox has %d rows, want 1", n)
	}
}

func testDoTxRollback(t *testing.T) {
	s, c := setup(t)
	ctx := context.Background()
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = once.DoTx(ctx, c, s, tx, txIntent, func(ctx context.Context, tx *sql.Tx, a once.Attempt) (string, error) {
		tx.ExecContext(ctx, `INSERT INTO outbox (id, body) VALUES (?, ?)`, string(a.Key), "hello")
		return "", errors.New("validation failed after the write")
	})
	if err == nil || !strings.Contains(err.Error(), "roll it back") {
		t.Fatalf("DoTx = %v", err)
	}
	tx.Rollback()
	k, _, _ := once.KeyOf(txIntent)
	if _, err := s.Get(ctx, k); !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("after rollback Get = %v, want not found", err)
	}
	if n := countOutbox(t, s); n != 0 {
		t.Fatalf("outbox has %d rows after rollback", n)
	}
}

// A transaction of the wrong type does not compile (TxBinder is typed);
// a transaction bound by a store other than the client's is refused
// before anything is claimed or run.
func testDoTxOtherStore(t *testing.T) {
	s, c := setup(t)
	other, _ := setup(t)
	tx, err := other.DB().BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = once.DoTx(context.Background(), c, other, tx, txIntent, func(context.Context, *sql.Tx, once.Attempt) (int, error) {
		t.Error("effect ran")
		return 0, nil
	})
	if err == nil || !strings.Contains(err.Error(), "not the client's store") {
		t.Fatalf("DoTx with another store = %v, want an error saying so", err)
	}
	k, _, _ := once.KeyOf(txIntent)
	for _, st := range []*sqlite.Store{s, other} {
		if _, err := st.Get(context.Background(), k); !errors.Is(err, once.ErrNotFound) {
			t.Fatalf("a refused DoTx left a row: %v", err)
		}
	}
}
