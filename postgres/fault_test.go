package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

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
	s, p := proxiedStoreWith(t, specConfig(spec))
	return s, proxyFaults{p}
}

// pgMarkers are texts found only in the claim of a new key and in
// Transition's statement.
var pgMarkers = storetest.Markers{Claim: "ON CONFLICT (key) DO NOTHING", Transition: "WITH u AS ("}

// proxyFaults are storetest.Faults on a fault proxy.
type proxyFaults struct{ p *faultproxy.Proxy }

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
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec&pool_max_conns=4", cc.User, p.Addr(), cc.Database)
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

// faultClients returns a client over a store reached through a fault
// proxy, one over a direct store on the same schema, the proxy, and the
// direct store.
func faultClients(t *testing.T, cfg once.Config) (cut, direct *once.Client, proxy *faultproxy.Proxy, s once.Store) {
	t.Helper()
	d, schema := newStore(t)
	if err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ps, proxy := proxiedStore(t, schema)
	cfg.Store = ps
	cut, err := once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store = d
	direct, err = once.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cut, direct, proxy, d
}
