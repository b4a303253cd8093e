package postgres_test

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// TestOpenSizesThePool: a URL that names no pool size gets a pool with
// room for the batches in flight and as many connections again for the
// heartbeats, reads and recovery beside them, more than pgx's default of
// max(4, cores), which group commit alone would fill. A size the URL
// names is kept, and a pool too small for the batches gets fewer of
// them: half the pool at most, so a heartbeat never waits behind
// batches for a connection.
func TestOpenSizesThePool(t *testing.T) {
	url := testdb.RequirePostgres(t)
	ctx := context.Background()
	open := func(url string, cfg postgres.Config) *postgres.Store {
		t.Helper()
		s, err := testdb.RetryTooManyClients(ctx, func() (*postgres.Store, error) { return postgres.Open(ctx, url, cfg) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	s := open(url, postgres.Config{})
	want := int32(2*4 + 4*runtime.NumCPU())
	if got := s.Pool().Config().MaxConns; got != want {
		t.Fatalf("Open's pool holds %d connections, want 2×4 batches + 4×%d cores = %d", got, runtime.NumCPU(), want)
	}
	if got := postgres.BatchRunners(s); got != 4 {
		t.Fatalf("%d batches in flight, want the default 4", got)
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	s = open(url+sep+"pool_max_conns=3", postgres.Config{BatchesInFlight: 4})
	if got := s.Pool().Config().MaxConns; got != 3 {
		t.Fatalf("the URL's pool_max_conns=3 became %d", got)
	}
	if got := postgres.BatchRunners(s); got != 1 {
		t.Fatalf("a pool of 3 sends %d batches at once, want 1: half the pool at most", got)
	}

	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(ctx, pc) // connects lazily
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ns, err := postgres.New(pool, postgres.Config{BatchesInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if got := postgres.BatchRunners(ns); got != 5 {
		t.Fatalf("a pool of 10 asked for 8 batches sends %d at once, want 5", got)
	}
	if us, err := postgres.New(pool, postgres.Config{Unbatched: true}); err != nil || postgres.BatchRunners(us) != 0 {
		t.Fatalf("unbatched store: %v, %d batches", err, postgres.BatchRunners(us))
	}
}
