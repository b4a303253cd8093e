package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/storetest"
)

func TestMain(m *testing.M) {
	storetest.MaybeChild(openSpec)
	code := m.Run()
	if pool != nil {
		pool.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// A spec is a schema name; worker processes open the same schema.
func openSpec(ctx context.Context, schema string) (once.Store, error) {
	return postgres.Open(ctx, testdb.PostgresURL(), postgres.Config{Schema: schema})
}

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
)

// sharedPool is one pool for the package's tests; each test isolates
// itself in a schema of its own.
func sharedPool(t testing.TB) *pgxpool.Pool {
	url := testdb.RequirePostgres(t)
	poolOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 32
		pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
	})
	return pool
}

// newStore returns a store in a fresh schema, dropped when the test ends.
func newStore(t testing.TB) (once.Store, string) {
	p := sharedPool(t)
	var b [6]byte
	rand.Read(b[:])
	schema := "once_test_" + hex.EncodeToString(b[:])
	s, err := postgres.New(p, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	return s, schema
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{New: func(t *testing.T) (once.Store, string) { return newStore(t) }, Open: openSpec})
	t.Run("DoTx", func(t *testing.T) { t.Parallel(); testDoTx(t) })
	t.Run("DoTxRollback", func(t *testing.T) { t.Parallel(); testDoTxRollback(t) })
	t.Run("DoTxOtherStore", func(t *testing.T) { t.Parallel(); testDoTxOtherStore(t) })
	t.Run("Prefix", func(t *testing.T) { t.Parallel(); testPrefix(t) })
}

func setup(t *testing.T) (*postgres.Store, *once.Client, string) {
	s, schema := newStore(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sharedPool(t).Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "outbox"}.Sanitize()+` (id text PRIMARY KEY, body text)`); err != nil {
		t.Fatal(err)
	}
	c, err := once.New(once.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	return s.(*postgres.Store), c, pgx.Identifier{schema, "outbox"}.Sanitize()
}

var txIntent = once.Intent{Run: "r", Kind: "write_outbox", Target: "m-1", Payload: "hello"}

func testDoTx(t *testing.T) {
	s, c, outbox := setup(t)
	ctx := context.Background()
	for i := range 2 {
		tx, err := s.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := once.DoTx(ctx, c, s, tx, txIntent, func(ctx context.Context, tx pgx.Tx, a once.Attempt) (string, error) {
			_, err := tx.Exec(ctx, `INSERT INTO `+outbox+` (id, body) VALUES ($1, $2)`, a.Key, "hello")
			return "written", err
		})
		if err != nil || res.Value != "written" || res.Replayed != (i == 1) {
			t.Fatalf("DoTx #%d = %+v, %v", i+1, res, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+outbox).Scan(&n)
	if n != 1 {
		t.Fatalf("outbox has %d rows, want 1", n)
	}
	k, _, _ := once.KeyOf(txIntent)
	if a, err := s.Get(ctx, k); err != nil || a.Status != once.StatusSucceeded {
		t.Fatalf("stored %+v, %v", a, err)
	}
}

func testDoTxRollback(t *testing.T) {
	s, c, outbox := setup(t)
	ctx := context.Background()
	tx, _ := s.Pool().Begin(ctx)
	_, err := once.DoTx(ctx, c, s, tx, txIntent, func(ctx context.Context, tx pgx.Tx, a once.Attempt) (string, error) {
		tx.Exec(ctx, `INSERT INTO `+outbox+` (id, body) VALUES ($1, $2)`, a.Key, "hello")
		return "", errors.New("validation failed after the write")
	})
	if err == nil || !strings.Contains(err.Error(), "roll it back") {
		t.Fatalf("DoTx = %v, want the effect's error and advice to roll back", err)
	}
	tx.Rollback(ctx)
	k, _, _ := once.KeyOf(txIntent)
	if _, err := s.Get(ctx, k); !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("after rollback Get = %v, want not found: claim and effect roll back together", err)
	}
	var n int
	s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+outbox).Scan(&n)
	if n != 0 {
		t.Fatalf("outbox has %d rows after rollback", n)
	}
	// The next delivery claims afresh.
	if _, err := once.Do(ctx, c, txIntent, func(context.Context, once.Attempt) (string, error) { return "ok", nil }); err != nil {
		t.Fatal(err)
	}
}

// A transaction of the wrong type does not compile (TxBinder is typed);
// a transaction bound by a store other than the client's is refused
// before anything is claimed or run.
func testDoTxOtherStore(t *testing.T) {
	s, c, _ := setup(t)
	other, _, _ := setup(t)
	ctx := context.Background()
	tx, err := other.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = once.DoTx(ctx, c, other, tx, txIntent, func(context.Context, pgx.Tx, once.Attempt) (int, error) {
		t.Error("effect ran")
		return 0, nil
	})
	if err == nil || !strings.Contains(err.Error(), "not the client's store") {
		t.Fatalf("DoTx with another store = %v, want an error saying so", err)
	}
	k, _, _ := once.KeyOf(txIntent)
	for _, st := range []*postgres.Store{s, other} {
		if _, err := st.Get(ctx, k); !errors.Is(err, once.ErrNotFound) {
			t.Fatalf("a refused DoTx left a row: %v", err)
		}
	}
}

func testPrefix(t *testing.T) {
	p := sharedPool(t)
	ctx := context.Background()
	_, schema := newStore(t)
	a, _ := postgres.New(p, postgres.Config{Schema: schema, Prefix: "a_"})
	b, _ := postgres.New(p, postgres.Config{Schema: schema, Prefix: "b_"})
	for _, s := range []*postgres.Store{a, b} {
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ca, _ := once.New(once.Config{Store: a})
	cb, _ := once.New(once.Config{Store: b})
	for _, c := range []*once.Client{ca, cb} {
		res, err := once.Do(ctx, c, txIntent, func(context.Context, once.Attempt) (int, error) { return 1, nil })
		if err != nil || res.Replayed {
			t.Fatalf("prefixes must not share rows: %+v %v", res, err)
		}
	}
	if _, err := postgres.New(p, postgres.Config{Prefix: `x"; drop table y; --`}); err == nil {
		t.Fatal("an unsafe prefix was accepted")
	}
}

// TestUnreachable covers a server that refuses and one that accepts but
// never answers: each error names the store and the address, and neither
// outlives the context.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // hold it open, say nothing
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()

	for _, tc := range []struct{ name, addr string }{
		{"refused", closedAddr},
		{"silent", ln.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := postgres.Open(ctx, "postgres://postgres@"+tc.addr+"/test?sslmode=disable&connect_timeout=60", postgres.Config{})
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "postgres store at "+tc.addr) {
					t.Fatalf("Open = %v, want an error naming the store and %s", err, tc.addr)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Open hung past its context")
			}
		})
	}
	_, err = postgres.Open(context.Background(), "mysql://nope", postgres.Config{})
	if err == nil || !strings.Contains(err.Error(), "postgres://") {
		t.Fatalf("bad URL: %v", err)
	}
}

// TestDatabaseGoesAway stops the store's connections mid-effect: the
// effect ran, the outcome cannot be recorded, and the claim stays in
// flight so that no redelivery repeats it.
func TestDatabaseGoesAway(t *testing.T) {
	url := testdb.RequirePostgres(t)
	ctx := context.Background()
	s, schema := newStore(t)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// A store of its own whose connections we can cut.
	cfg, _ := pgxpool.ParseConfig(url)
	cfg.ConnConfig.RuntimeParams["application_name"] = "once_goes_away_" + schema
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	victim, _ := postgres.New(p, postgres.Config{Schema: schema})
	c, _ := once.New(once.Config{Store: victim, RecordTimeout: 300 * time.Millisecond})
	in := once.Intent{Run: "r", Kind: "send_email", Target: "x@example.com"}
	// Block new connections from this application while the effect runs.
	res, err := once.Do(ctx, c, in, func(ctx context.Context, a once.Attempt) (string, error) {
		p.Reset()
		if _, err := sharedPool(t).Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, "once_goes_away_"+schema); err != nil {
			t.Error(err)
		}
		p.Close() // the database is gone for this worker
		return "sent", nil
	})
	if !errors.Is(err, once.ErrNotRecorded) || res.Value != "sent" {
		t.Fatalf("Do = %+v, %v; want ErrNotRecorded with the value", res, err)
	}
	if !strings.Contains(err.Error(), "recovery applies") {
		t.Fatalf("message %q does not say what happens next", err)
	}
	k, _, _ := once.KeyOf(in)
	a, err := s.Get(ctx, k)
	if err != nil || a.Status != once.StatusInFlight {
		t.Fatalf("stored %+v, %v; want the claim still in flight", a, err)
	}
	// The redelivered job, on a healthy worker, does not send again.
	healthy, _ := once.New(once.Config{Store: s})
	if _, err := once.Do(ctx, healthy, in, func(context.Context, once.Attempt) (string, error) {
		t.Error("effect repeated after the database went away")
		return "", nil
	}); !errors.Is(err, once.ErrInFlight) {
		t.Fatalf("redelivery = %v, want ErrInFlight", err)
	}
}
