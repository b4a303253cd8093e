package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// hangProxy is a fault proxy in front of the test database.
func hangProxy(t *testing.T) (*faultproxy.Proxy, *pgx.ConnConfig) {
	cc, err := pgx.ParseConfig(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(fmt.Sprintf("%s:%d", cc.Host, cc.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, cc
}

// behindProxy opens a store with a pool of its own (pool_max_conns=n,
// and params) through a fault proxy, on a migrated schema.
func behindProxy(t *testing.T, n int, params string, cfg postgres.Config) (*postgres.Store, *faultproxy.Proxy, string) {
	t.Helper()
	d, schema := newStore(t)
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	p, cc := hangProxy(t)
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec&pool_max_conns=%d%s", cc.User, p.Addr(), cc.Database, n, params)
	cfg.Schema, cfg.PollOnly = schema, true
	s, err := postgres.Open(context.Background(), url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, p, schema
}

// onCallersPool is a store over a pool of the test's own (two
// connections, through a fault proxy), which the store's Close leaves
// open.
func onCallersPool(t *testing.T) (*postgres.Store, *faultproxy.Proxy) {
	t.Helper()
	d, schema := newStore(t)
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	p, cc := hangProxy(t)
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&pool_max_conns=2", cc.User, p.Addr(), cc.Database)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(pool, postgres.Config{Schema: schema, Unbatched: true, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	return s, p
}

// hangGet is a Get of key whose reply hangs, given up on after 200 ms.
func hangGet(s *postgres.Store, p *faultproxy.Proxy, key once.Key) {
	hung := p.HangAfter([]byte(key), faultproxy.PostgresReady)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	s.Get(ctx, key)
	cancel()
	<-hung
}

// backends counts the server's sessions of application app.
func backends(t *testing.T, app string) int {
	var n int
	if err := sharedPool(t).QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHungConnectionsStayWithinTwicePoolSize: a connection taken out of
// the pool as pgx closed it has its socket closed at once, so its
// server session ends, and at most MaxConns are out at a time: ten
// hangs in a row on a pool of two leave the server holding at most
// four of the store's connections, where each used to stay open for
// pgx's 15 s drain while the pool opened another (ten at once).
func TestHungConnectionsStayWithinTwicePoolSize(t *testing.T) {
	app := fmt.Sprintf("hangmax_%d", time.Now().UnixNano())
	s, p, _ := behindProxy(t, 2, "&application_name="+app, postgres.Config{Unbatched: true})
	maxSeen := 0
	for i := range 10 {
		key := once.Key(fmt.Sprintf("hangmax%03d", i))
		hung := p.HangAfter([]byte(key), faultproxy.PostgresReady)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := s.Get(ctx, key)
		cancel()
		select {
		case <-hung:
		default:
			t.Logf("get %d did not hang: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
		n := backends(t, app)
		maxSeen = max(maxSeen, n)
	}
	if maxSeen > 4 {
		t.Errorf("pool_max_conns=2, but the server held %d of the store's connections at once; want at most 4", maxSeen)
	}
}

// TestStoreUsedWhileItClosesHungConnections: a store over a caller's
// pool is still used after Close (a waiter polling, a Do finishing),
// and a connection pgx closed may be taken out of the pool then. Its
// count must not race Close (-race caught a WaitGroup Add against its
// Wait).
func TestStoreUsedWhileItClosesHungConnections(t *testing.T) {
	s, p := onCallersPool(t)
	hangGet(s, p, "hangrace001") // one connection draining
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	time.Sleep(200 * time.Millisecond) // Close is in Wait
	p.Reset()                          // the drain ends: Wait returns
	time.Sleep(200 * time.Millisecond)
	// The store is still used (a waiter polling, a Do finishing).
	if _, err := s.Get(context.Background(), "warm"); !errors.Is(err, once.ErrNotFound) {
		t.Errorf("a read after Close: %v; want ErrNotFound", err)
	}
	hangGet(s, p, "hangrace002") // counted from zero, unordered with Close
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Error("Close still waits after 10 s")
	}
}

// TestCloseOnCallersPoolDoesNotWait: Close of a store over a caller's
// pool returns at once, as it did, whatever connections pgx still
// closes in the background (it waited out pgx's 15 s drain).
func TestCloseOnCallersPoolDoesNotWait(t *testing.T) {
	s, p := onCallersPool(t)
	hangGet(s, p, "hangblock")
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Error("Close of a store over the caller's pool still waits after 10 s; pgx's drain takes 15 s")
	}
}

// TestPoolRecoversAfterTwoShortOutages: two short network outages, each
// hanging two statements on a pool of two, with pgx's cancel requests
// lost too, as in a partition. A read once the network is back gets a
// connection: the first outage's connections, whose clean-up takes
// pgx's 15 s, count against the cap of connections out of the pool for
// two seconds only, so the second's are taken out too, where they held
// both of the pool's slots for those 15 s.
func TestPoolRecoversAfterTwoShortOutages(t *testing.T) {
	t.Parallel()
	s, p, _ := behindProxy(t, 2, "", postgres.Config{Unbatched: true})
	outage := func(n int) {
		// Both connections open, so both hang.
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if c, err := s.Pool().Acquire(context.Background()); err == nil {
					time.Sleep(50 * time.Millisecond)
					c.Release()
				}
			})
		}
		wg.Wait()
		p.Blackout(true)
		for i := range 2 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				if _, err := s.Get(ctx, once.Key(fmt.Sprintf("outage%d-%d", n, i))); err == nil {
					t.Error("a read through the black hole was answered")
				}
			})
		}
		wg.Wait()
		time.Sleep(100 * time.Millisecond)
		p.Blackout(false)
	}
	outage(1)
	time.Sleep(2500 * time.Millisecond) // past capFor, within pgx's 15 s
	outage(2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Get(ctx, "after"); !errors.Is(err, once.ErrNotFound) {
		t.Fatalf("a read once the network is back = %v; want an answer (ErrNotFound) within 5 s", err)
	}
}
