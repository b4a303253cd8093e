package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

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
	d, schema := newStore(t)
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	p, cc := hangProxy(t)
	app := "hangmax_" + schema
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&pool_max_conns=2&application_name=%s", cc.User, p.Addr(), cc.Database, app)
	s, err := postgres.Open(context.Background(), url, postgres.Config{Schema: schema, Unbatched: true, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
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
	defer pool.Close()
	s, err := postgres.New(pool, postgres.Config{Schema: schema, Unbatched: true, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	hang := func(key once.Key) {
		hung := p.HangAfter([]byte(key), faultproxy.PostgresReady)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		s.Get(ctx, key)
		cancel()
		<-hung
	}
	hang("hangrace001") // one connection draining
	closed := make(chan time.Duration, 1)
	go func() {
		t0 := time.Now()
		s.Close()
		closed <- time.Since(t0)
	}()
	time.Sleep(200 * time.Millisecond) // Close is in Wait
	p.Reset()                          // the drain ends: Wait returns
	time.Sleep(200 * time.Millisecond)
	// The store is still used (a waiter polling, a Do finishing).
	if _, err := s.Get(context.Background(), "warm"); !errors.Is(err, once.ErrNotFound) {
		t.Errorf("a read after Close: %v; want ErrNotFound", err)
	}
	hang("hangrace002") // counted from zero, unordered with Close
	if took := <-closed; took > 10*time.Second {
		t.Errorf("Close took %v", took)
	}
}

// TestCloseOnCallersPoolDoesNotWait: Close of a store over a caller's
// pool returns at once, as it did, whatever connections pgx still
// closes in the background (it waited out pgx's 15 s drain).
func TestCloseOnCallersPoolDoesNotWait(t *testing.T) {
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
	defer pool.Close()
	s, err := postgres.New(pool, postgres.Config{Schema: schema, Unbatched: true, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	hung := p.HangAfter([]byte("hangblock"), faultproxy.PostgresReady)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	s.Get(ctx, "hangblock")
	cancel()
	<-hung
	t0 := time.Now()
	s.Close()
	if el := time.Since(t0); el > 2*time.Second {
		t.Errorf("Close of a store over the caller's pool blocked %v", el)
	}
}
