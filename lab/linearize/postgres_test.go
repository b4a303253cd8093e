package linearize_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/postgres"
)

// TestLinearizablePostgres runs the workload over a schema of its own,
// with one client connected directly and one through a fault proxy that
// loses and hangs replies after the server committed, black-holes and
// refuses connections, and resets them.
func TestLinearizablePostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("a run of about half a minute")
	}
	url := testdb.RequirePostgres(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "once_linearize_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	direct := openStore(t, ctx, withParams(url, "pool_max_conns=3"), schema)
	t.Cleanup(func() {
		direct.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	if err := direct.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	// Statements carry their text every time, so the proxy's markers
	// see each execution.
	proxied := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec&pool_max_conns=4", cfg.User, proxy.Addr(), cfg.Database)
	faulted := openStore(t, ctx, proxied, schema)
	t.Cleanup(func() { proxy.Close() })
	lease := 400 * time.Millisecond
	newWorld(t, lease, 6, direct, faulted, &proxyFaults{p: proxy, lease: lease}).run()
}

func withParams(url, params string) string {
	if strings.Contains(url, "?") {
		return url + "&" + params
	}
	return url + "?" + params
}

// openStore opens a store on schema, waiting out the shared server's
// connection limit; it is closed when the test ends (after the schema
// is dropped, cleanups running last first).
func openStore(t *testing.T, ctx context.Context, url, schema string) *postgres.Store {
	t.Helper()
	s, err := testdb.RetryTooManyClients(ctx, func() (*postgres.Store, error) {
		return postgres.Open(ctx, url, postgres.Config{Schema: schema})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// proxyFaults are the fault proxy's failures. A lost or hung reply is
// armed and happens to the next matching statement of the faulted
// client; the others last for the round.
type proxyFaults struct {
	p      *faultproxy.Proxy
	lease  time.Duration
	mu     sync.Mutex
	counts map[string]int
	armed  map[string][]<-chan struct{}
}

// markers are texts found only in one statement of the store's SQL.
var markers = map[string]string{
	"claim":     "ON CONFLICT (key) DO NOTHING",
	"reclaim":   "status = 'released' AND fingerprint",
	"outcome":   "WITH u AS (",
	"heartbeat": "RETURNING lease_until",
	"recover":   "AND lease_until <= now()",
}

func (f *proxyFaults) kinds() []string {
	return []string{
		"lose-claim", "lose-reclaim", "lose-outcome", "lose-heartbeat", "lose-recover",
		"hang-claim", "hang-outcome",
		"blackout-short", "blackout-past-lease", "blackout-long", "refuse", "reset",
	}
}

func (f *proxyFaults) inject(kind string) (func(), time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counts == nil {
		f.counts, f.armed = map[string]int{}, map[string][]<-chan struct{}{}
	}
	f.counts[kind]++
	verb, what, _ := strings.Cut(kind, "-")
	switch verb {
	case "lose":
		f.armed[kind] = append(f.armed[kind], f.p.CutAfter([]byte(markers[what]), faultproxy.PostgresReady))
	case "hang":
		f.armed[kind] = append(f.armed[kind], f.p.HangAfter([]byte(markers[what]), faultproxy.PostgresReady))
	case "blackout":
		// Shorter than the lease; past it, within RecordTimeout; past
		// RecordTimeout.
		d := map[string]time.Duration{"short": f.lease / 2, "past-lease": 3 * f.lease, "long": longFault(f.lease)}[what]
		f.p.Blackout(true)
		t := time.AfterFunc(d, func() { f.heal() })
		return func() {
			t.Stop()
			f.heal()
		}, d
	case "refuse":
		f.p.Refuse(true)
		f.p.Reset()
		return func() { f.p.Refuse(false) }, f.lease
	case "reset":
		f.p.Reset()
	}
	return nil, 0
}

// heal ends a black hole; the streams of connections that lived through
// it have gaps, so they are closed and the pool reconnects.
func (f *proxyFaults) heal() {
	f.p.Blackout(false)
	f.p.Reset()
}

func (f *proxyFaults) report() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for kind, n := range f.counts {
		s := fmt.Sprintf("%s ×%d", kind, n)
		if chans, ok := f.armed[kind]; ok {
			hit := 0
			for _, c := range chans {
				select {
				case <-c:
					hit++
				default:
				}
			}
			s += fmt.Sprintf(" (%d happened)", hit)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}
