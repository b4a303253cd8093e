package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/storetest"
)

// pgFaults gives the partial-failure tests a second store on the schema,
// reached through a loopback fault proxy, as a worker on another machine
// would reach the same database.
func pgFaults(t *testing.T, spec string) (once.Store, storetest.Faults) {
	cfg := specConfig(spec)
	s, p := proxiedStoreWith(t, cfg)
	admin := sharedPool(t)
	app := appName(cfg.Schema)
	return s, proxyFaults{p: p, locker: admin, schema: cfg.Schema, end: func() { terminate(t, admin, app) }}
}

// appName is the application_name of the connections of a store
// proxiedStoreWith opens on schema.
func appName(schema string) string { return "once_fault_" + schema }

// terminate ends, on the server, every session of application app, as
// a DBA's pg_terminate_backend or idle_session_timeout does, and waits
// until they are gone.
func terminate(t *testing.T, admin *pgxpool.Pool, app string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
		t.Errorf("ending the store's connections: %v", err)
		return
	}
	for {
		var left int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&left); err != nil {
			t.Errorf("counting the store's connections: %v", err)
			return
		}
		if left == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// pgMarkers are texts found only in the claim of a new key, in
// Transition's statement, in the read of a trail, in Recoverable's batch
// and in AppendEvent's statement, as the client sends them: none holds
// a parameter's marker, which the simple protocol sends as its value.
// The read of a trail is the only statement that ends "ORDER BY id",
// and a statement's text ends with a NUL in both protocols.
var pgMarkers = storetest.Markers{Claim: "ON CONFLICT (key) DO NOTHING", Transition: "WITH u AS (",
	Events: "ORDER BY id\x00", Recoverable: "ORDER BY lease_until", AppendEvent: "origin) VALUES (",
	Reclaim: "SET status = 'in_flight', attempt = attempt + 1"}

// proxyFaults are storetest.Faults on a fault proxy. Lock locks a row
// of schema's action table through locker, a pool that reaches the
// database directly.
type proxyFaults struct {
	p      *faultproxy.Proxy
	locker *pgxpool.Pool
	schema string
	// end ends the store's connections.
	end func()
}

func (f proxyFaults) End() { f.end() }

func (f proxyFaults) Lock(ctx context.Context, key once.Key) (func() error, error) {
	tx, err := f.locker.Begin(ctx)
	if err != nil {
		return nil, err
	}
	table := pgx.Identifier{f.schema, "once_action"}.Sanitize()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+table+` WHERE key = $1 FOR UPDATE`, string(key)); err != nil {
		tx.Rollback(ctx)
		return nil, err
	}
	return func() error { return tx.Rollback(context.Background()) }, nil
}

func (f proxyFaults) Hang(on bool) {
	f.p.Blackout(on)
	if !on {
		// The streams of connections that lived through the black hole
		// have gaps: close them, so the pool reconnects.
		f.p.Reset()
	}
}

func (f proxyFaults) Refuse(on bool) {
	f.p.Refuse(on)
	if on {
		f.p.Reset()
	}
}

func (f proxyFaults) LoseReply(marker string, hang bool) <-chan struct{} {
	if hang {
		return f.p.HangAfter([]byte(marker), faultproxy.PostgresReady)
	}
	return f.p.CutAfter([]byte(marker), faultproxy.PostgresReady)
}

// proxiedStore opens a second store on schema through a fault proxy.
// Statements carry their text every time, so a proxy's marker sees each
// execution.
func proxiedStore(t *testing.T, schema string) (*postgres.Store, *faultproxy.Proxy) {
	t.Helper()
	return proxiedStoreWith(t, postgres.Config{Schema: schema})
}

// proxiedStoreWith is proxiedStore with cfg.
func proxiedStoreWith(t *testing.T, cfg postgres.Config) (*postgres.Store, *faultproxy.Proxy) {
	t.Helper()
	cc, err := pgx.ParseConfig(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(fmt.Sprintf("%s:%d", cc.Host, cc.Port))
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec&pool_max_conns=4&application_name=%s", cc.User, p.Addr(), cc.Database, appName(cfg.Schema))
	s, err := postgres.Open(context.Background(), url, cfg)
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		s.Close()
	})
	return s, p
}
