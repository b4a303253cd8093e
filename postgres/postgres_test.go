package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

// A spec is a schema name; worker processes open the same schema. The
// server is shared, so opening waits out its connection limit, and takes
// the few connections a worker uses then: a connection refused later
// would fail the worker halfway and leave its test waiting for it. A
// spec that is a URL reaches the server another way (see pooledSpec).
func openSpec(ctx context.Context, spec string) (once.Store, error) {
	if strings.HasPrefix(spec, "postgres://") {
		return openPooledSpec(ctx, spec)
	}
	return openSpecAt(ctx, testdb.PostgresURL(), specConfig(spec))
}

// unbatchedSpec starts the spec of a store with Config.Unbatched.
const unbatchedSpec = "unbatched:"

// specConfig is the configuration a schema spec names.
func specConfig(spec string) postgres.Config {
	schema, unbatched := strings.CutPrefix(spec, unbatchedSpec)
	return postgres.Config{Schema: schema, Unbatched: unbatched}
}

func openSpecAt(ctx context.Context, url string, cfg postgres.Config) (*postgres.Store, error) {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return testdb.RetryTooManyClients(ctx, func() (*postgres.Store, error) {
		s, err := postgres.Open(ctx, url+sep+"pool_max_conns=2", cfg)
		if err != nil {
			return nil, err
		}
		if err := testdb.Warm(ctx, s.Pool()); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	})
}

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
)

// sharedPool is one pool for the package's tests; each test isolates
// itself in a schema of its own. It is kept small: the server's
// max_connections is shared with every other test process.
func sharedPool(t testing.TB) *pgxpool.Pool {
	url := testdb.RequirePostgres(t)
	poolOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 12
		pool, poolErr = openPool(cfg)
	})
	if poolErr != nil {
		t.Fatal(poolErr)
	}
	return pool
}

// openPool makes a pool and waits for its first connection, out of the
// server's connection limit if need be.
func openPool(cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := testdb.RetryTooManyClients(ctx, func() (struct{}, error) { return struct{}{}, p.Ping(ctx) }); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// newStore returns a store in a fresh schema, dropped when the test ends.
func newStore(t testing.TB) (*postgres.Store, string) {
	return newStoreWith(t, postgres.Config{})
}

// newStoreWith is newStore with cfg, whose Schema it sets.
func newStoreWith(t testing.TB, cfg postgres.Config) (*postgres.Store, string) {
	p := sharedPool(t)
	var b [6]byte
	rand.Read(b[:])
	schema := "once_test_" + hex.EncodeToString(b[:])
	cfg.Schema = schema
	s, err := postgres.New(p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	// The pool is shared: Close stops only the store's listening
	// connection, before the schema goes.
	t.Cleanup(func() { s.Close() })
	return s, schema
}

func harness() storetest.Harness {
	return storetest.Harness{
		New:      func(t *testing.T) (once.Store, string) { return newStore(t) },
		Open:     openSpec,
		Tx:       pgTx,
		Faults:   pgFaults,
		Markers:  pgMarkers,
		Features: storetest.Features{Processes: true, RowLocks: true, Refusal: true, LostReplies: true, Partition: true},
	}
}

// unbatchedHarness is harness with group commit off: every claim and
// outcome a statement of its own, worker processes' too.
func unbatchedHarness() storetest.Harness {
	h := harness()
	h.New = func(t *testing.T) (once.Store, string) {
		s, schema := newStoreWith(t, postgres.Config{Unbatched: true})
		return s, unbatchedSpec + schema
	}
	return h
}

// pgTx gives the DoTx tests transactions on the shared pool, and an
// application table in the test's schema for the effect to write.
func pgTx(t *testing.T, st once.Store, spec string) storetest.TxHarness {
	t.Helper()
	schema := specConfig(spec).Schema
	s := st.(*postgres.Store)
	outbox := pgx.Identifier{schema, "outbox"}.Sanitize()
	if _, err := s.Pool().Exec(context.Background(), `CREATE TABLE `+outbox+` (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return storetest.TxOf(s, storetest.TxFuncs[pgx.Tx]{
		Begin:    func(ctx context.Context) (pgx.Tx, error) { return s.Pool().Begin(ctx) },
		Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		Insert: func(ctx context.Context, tx pgx.Tx, id string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+outbox+` (id) VALUES ($1)`, id)
			return err
		},
		Count: func(ctx context.Context) (n int, err error) {
			return n, s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+outbox).Scan(&n)
		},
	})
}

// TestStore runs the Store contract, a schema per test.
func TestStore(t *testing.T) { storetest.RunStore(t, harness()) }

// TestClient runs the engine over the postgres store, DoTx included.
func TestClient(t *testing.T) { storetest.RunClient(t, harness()) }

// TestStoreUnbatched runs the Store contract with group commit off.
func TestStoreUnbatched(t *testing.T) { storetest.RunStore(t, unbatchedHarness()) }

// TestClientUnbatched runs the engine over the store with group commit
// off.
func TestClientUnbatched(t *testing.T) { storetest.RunClient(t, unbatchedHarness()) }

// TestPrefix keeps two sets of tables apart in one schema by their
// prefixes, and refuses a prefix that is not a plain identifier.
func TestPrefix(t *testing.T) {
	t.Parallel()
	testPrefix(t)
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
		in := once.Intent{Run: "r", Kind: "write_outbox", Target: "m-1", Payload: "hello"}
		res, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return 1, nil })
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

// TestOpenSpecHoldsItsConnections: a worker process opened by the
// harness while the server is at its connection limit waits for a slot,
// and once open is not refused a connection when it runs two queries at
// once, though another client has taken the last slot meanwhile. The
// limit is a role's CONNECTION LIMIT, which the server enforces with the
// same SQLSTATE 53300 as max_connections, without crowding other tests.
func TestOpenSpecHoldsItsConnections(t *testing.T) {
	p := sharedPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b [6]byte
	rand.Read(b[:])
	role := "once_limited_" + hex.EncodeToString(b[:])
	if _, err := p.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN CONNECTION LIMIT 2`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Exec(context.Background(), `DROP ROLE IF EXISTS `+pgx.Identifier{role}.Sanitize()) })
	cfg, err := pgx.ParseConfig(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", role, net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), cfg.Database)
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// The role is at its limit while the worker opens.
	busy := []*pgx.Conn{connect(), connect()}
	time.AfterFunc(200*time.Millisecond, func() {
		for _, c := range busy {
			c.Close(context.Background())
		}
	})
	s, err := openSpecAt(ctx, url, postgres.Config{Schema: "public"})
	if err != nil {
		t.Fatalf("opening at the connection limit: %v", err)
	}
	defer s.Close()

	// Another client takes what the worker does not hold.
	var others []*pgx.Conn
	defer func() {
		for _, c := range others {
			c.Close(context.Background())
		}
	}()
	for {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			if !testdb.TooManyClients(err) {
				t.Fatal(err)
			}
			break
		}
		others = append(others, c)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			_, err := s.Pool().Exec(ctx, `SELECT pg_sleep(0.1)`)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a query of the opened worker's store: %v", err)
		}
	}
}
