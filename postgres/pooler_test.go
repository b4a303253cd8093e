package postgres_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
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

// The store behind PgBouncer: a private PgBouncer per test, in front of
// the test server, in transaction mode unless a test says otherwise.

// safeModes are the default_query_exec_modes that prepare no named
// statement and send each statement whole in one round trip.
var safeModes = []string{"exec", "cache_describe", "simple_protocol"}

// TestPooler runs the Store contract and the engine's suite through
// PgBouncer in transaction mode, in each mode the store accepts there:
// a schema per test, worker processes and DoTx transactions through the
// pooler too, and the partial failures on a fault proxy in front of it.
func TestPooler(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{})
	for _, mode := range safeModes {
		t.Run(mode, func(t *testing.T) {
			h := pooledHarness(t, b, mode)
			t.Run("Store", func(t *testing.T) { storetest.RunStore(t, h) })
			t.Run("Client", func(t *testing.T) { storetest.RunClient(t, h) })
		})
	}
}

// pooledHarness is the harness of the package's tests, with every
// connection through b, and the pool in mode.
func pooledHarness(t *testing.T, b *testdb.PgBouncer, mode string) storetest.Harness {
	base := b.URL + "&default_query_exec_mode=" + mode
	cfg, err := pgxpool.ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	p, err := openPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	// cache_describe parses a statement once per connection to learn
	// its types, in a round trip of its own that the fault proxy's
	// markers match first: a reply "lost" there belongs to a statement
	// that never ran, which is not what the lost-reply tests are about.
	lostReplies := mode != "cache_describe"
	return storetest.Harness{
		New: func(t *testing.T) (once.Store, string) {
			schema := uniqueSchema("once_pooled_")
			s, err := postgres.New(p, postgres.Config{Schema: schema, Pooler: postgres.PoolerTransaction, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			dropSchema(t, schema)
			t.Cleanup(func() { s.Close() })
			return s, pooledSpec(base, schema)
		},
		Open: openSpec,
		Tx: func(t *testing.T, s once.Store, spec string) storetest.TxHarness {
			return pgTx(t, s, specSchema(t, spec))
		},
		Faults: func(t *testing.T, spec string) (once.Store, storetest.Faults) {
			return pooledFaults(t, b, mode, specSchema(t, spec))
		},
		Markers:  pgMarkers,
		Features: storetest.Features{Processes: true, RowLocks: true, Refusal: true, LostReplies: lostReplies, Partition: true},
	}
}

// quiet discards the pooled stores' notice that their waiters poll.
var quiet = slog.New(slog.DiscardHandler)

// pooledSpec is a spec for a store through a pooler: the URL, with the
// schema and the pooler's mode in once_schema and once_pooler, as the
// once command takes them.
func pooledSpec(base, schema string) string {
	return base + "&once_schema=" + schema + "&once_pooler=transaction"
}

// openPooledSpec opens the store a pooledSpec names.
func openPooledSpec(ctx context.Context, spec string) (*postgres.Store, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	pooler, err := postgres.ParsePooler(q.Get("once_pooler"))
	if err != nil {
		return nil, err
	}
	cfg := postgres.Config{Schema: q.Get("once_schema"), Pooler: pooler, Logger: quiet}
	q.Del("once_schema")
	q.Del("once_pooler")
	u.RawQuery = q.Encode()
	return openSpecAt(ctx, u.String(), cfg)
}

func specSchema(t *testing.T, spec string) string {
	t.Helper()
	u, err := url.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query().Get("once_schema")
}

// pooledFaults is a second store on schema through a fault proxy in
// front of the pooler: the proxy cuts and stalls the store's
// connections to PgBouncer, as a network between them would.
func pooledFaults(t *testing.T, b *testdb.PgBouncer, mode, schema string) (once.Store, storetest.Faults) {
	t.Helper()
	p, err := faultproxy.Start(b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// The store's connections are cut, not the cancel requests its
	// driver sends on the side (TestPgBouncerExitsOnCutCancel).
	p.Spare(faultproxy.PostgresCancel)
	u, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr()
	s, err := postgres.Open(context.Background(), u.String()+"&pool_max_conns=4&default_query_exec_mode="+mode,
		postgres.Config{Schema: schema, Pooler: postgres.PoolerTransaction, Logger: quiet})
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		s.Close()
	})
	// The pooler's sessions are not the store's: the store's end at the
	// proxy, as a pooler's restart ends them.
	return s, proxyFaults{p: p, locker: sharedPool(t), schema: schema, end: p.Reset}
}

// withParams adds query parameters (a=b&c=d) to a URL.
func withParams(u, params string) string {
	if strings.Contains(u, "?") {
		return u + "&" + params
	}
	return u + "?" + params
}

func uniqueSchema(prefix string) string {
	var b [6]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// dropSchema drops schema, directly, when the test ends.
func dropSchema(t *testing.T, schema string) {
	p := sharedPool(t)
	t.Cleanup(func() {
		p.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
}

// What the store guards against, shown on PgBouncer itself with one
// server connection, so that every client shares it.

// TestPgBouncerLosesPreparedStatements: pgx's default mode prepares a
// named statement per query text on the connection, and a second
// client that runs the same query through the same server connection
// finds it prepared already.
func TestPgBouncerLosesPreparedStatements(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{PoolSize: 1})
	ctx := context.Background()
	first, second := connect(t, b.URL), connect(t, b.URL)
	var n int
	if err := first.QueryRow(ctx, `SELECT 1 + $1::int`, 1).Scan(&n); err != nil {
		t.Fatal(err)
	}
	err := second.QueryRow(ctx, `SELECT 1 + $1::int`, 1).Scan(&n)
	if err == nil || !strings.Contains(err.Error(), "42P05") {
		t.Fatalf("the second client's statement = %v; want 42P05, prepared statement already exists", err)
	}
}

// TestPgBouncerRebindsUnnamedStatement: describe_exec parses a
// statement unnamed in one round trip and binds it in the next; between
// the two, another client parses its own unnamed statement on the same
// server connection, and the first client's arguments run in it.
func TestPgBouncerRebindsUnnamedStatement(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{PoolSize: 1})
	ctx := context.Background()
	mine, theirs := connect(t, b.URL), connect(t, b.URL)
	sd, err := mine.PgConn().Prepare(ctx, "", `SELECT 'mine: ' || $1::text`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := theirs.PgConn().Prepare(ctx, "", `SELECT 'theirs: ' || $1::text`, nil); err != nil {
		t.Fatal(err)
	}
	res := mine.PgConn().ExecPrepared(ctx, sd.Name, [][]byte{[]byte("my argument")}, nil, nil).Read()
	if res.Err != nil || len(res.Rows) != 1 {
		t.Fatalf("executing = %v, %d rows", res.Err, len(res.Rows))
	}
	if got := string(res.Rows[0][0]); got != "theirs: my argument" {
		t.Fatalf("got %q; PgBouncer no longer hands the unnamed statement over, and describe_exec may be safe behind it", got)
	}
}

// cutCancels gives up on statements through p and resets p as the
// drivers' cancel requests for them go through, rounds times or until
// PgBouncer b exits. It returns the rounds it ran and how many of the
// statements ended in an error (each should: it was given up on).
func cutCancels(t *testing.T, b *testdb.PgBouncer, p *faultproxy.Proxy, rounds int) (ran, failed int) {
	t.Helper()
	u, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr()
	var mu sync.Mutex
	for ran = 0; ran < rounds; ran++ {
		select {
		case <-b.Exited():
			return ran, failed
		default:
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				c, err := pgx.Connect(context.Background(), u.String())
				if err != nil {
					return
				}
				defer c.Close(context.Background())
				// pgx gives up at the deadline: it closes the
				// connection and, on one of its own, asks the server
				// to cancel the statement.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
				defer cancel()
				if _, err := c.Exec(ctx, `SELECT pg_sleep(0.5)`); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			})
		}
		// Reset as PgBouncer starts to forward a cancel request: the
		// moment its client leaving makes it exit.
		const started = "started sending cancel request"
		seen := strings.Count(b.Log(), started)
		for end := time.Now().Add(time.Second); strings.Count(b.Log(), started) == seen && time.Now().Before(end); {
			time.Sleep(100 * time.Microsecond)
		}
		p.Reset()
		wg.Wait()
	}
	return ran, failed
}

// TestPgBouncerExitsOnCutCancel: PgBouncer 1.18 exits when a cancel
// request's client leaves while PgBouncer still forwards it (its issue
// 801): a proxy that cuts every connection at once cuts one so. This is
// why the pooled fault proxy spares cancel requests (below); when the
// pooler no longer exits, the sparing can go.
func TestPgBouncerExitsOnCutCancel(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{MayExit: true})
	p, err := faultproxy.Start(b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ran, _ := cutCancels(t, b, p, 200)
	select {
	case <-b.Exited():
		if !strings.Contains(b.Log(), "bad client state") {
			t.Fatalf("PgBouncer exited after %d rounds, not for the reason known; its log:\n%s", ran, b.Log())
		}
	default:
		t.Fatalf("PgBouncer outlived %d rounds of cut cancel requests: this version may not need the fault proxy to spare them (faultproxy.Spare)", ran)
	}
}

// TestPoolerSparesCancelRequests: the fault proxy in front of the pooler
// spares cancel requests from its resets, and PgBouncer outlives the
// rounds that make it exit above, while the statements are still given
// up on and their connections cut.
func TestPoolerSparesCancelRequests(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{})
	p, err := faultproxy.Start(b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	p.Spare(faultproxy.PostgresCancel)
	defer p.Close()
	const rounds = 100
	ran, failed := cutCancels(t, b, p, rounds)
	if ran != rounds {
		t.Fatalf("PgBouncer exited after %d rounds; its log:\n%s", ran, b.Log())
	}
	if failed < rounds {
		t.Fatalf("%d statements failed in %d rounds of 4; want most of them given up on", failed, rounds)
	}
	if n := strings.Count(b.Log(), "successfully sent cancel request"); n == 0 {
		t.Fatal("no cancel request went through: the rounds did not test what they are for")
	}
	c, err := pgx.Connect(context.Background(), b.URL)
	if err != nil {
		t.Fatalf("PgBouncer does not answer after the rounds: %v", err)
	}
	c.Close(context.Background())
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TestPoolerRefusesDescribeExec: the store refuses describe_exec, named
// in the URL or set on the pool, whatever Config.Pooler says, and says
// what to use instead.
func TestPoolerRefusesDescribeExec(t *testing.T) {
	direct := testdb.RequirePostgres(t)
	ctx := context.Background()
	want := func(t *testing.T, err error) {
		t.Helper()
		if err == nil {
			t.Fatal("describe_exec was accepted")
		}
		for _, s := range []string{"describe_exec", "another client's statement", "default_query_exec_mode=exec"} {
			if !strings.Contains(err.Error(), s) {
				t.Fatalf("error %q does not say %q", err, s)
			}
		}
	}
	for _, pooler := range []postgres.Pooler{postgres.PoolerNone, postgres.PoolerSession, postgres.PoolerTransaction} {
		t.Run(fmt.Sprintf("pooler=%q", pooler), func(t *testing.T) {
			_, err := postgres.Open(ctx, withParams(direct, "default_query_exec_mode=describe_exec"), postgres.Config{Pooler: pooler})
			want(t, err)
			cfg, err := pgxpool.ParseConfig(direct)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeDescribeExec
			p, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			_, err = postgres.New(p, postgres.Config{Pooler: pooler})
			want(t, err)
		})
	}
}

// TestPoolerDefaultMode: through PgBouncer in transaction mode, pgx's
// default mode is refused (when the pooler is not named, Open and
// Migrate find it), and naming the pooler makes Open choose exec.
func TestPoolerDefaultMode(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{})
	ctx := context.Background()
	schema := uniqueSchema("once_pooled_")
	dropSchema(t, schema)
	wantErr := func(t *testing.T, what string, err error, says ...string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: accepted", what)
		}
		for _, s := range says {
			if !strings.Contains(err.Error(), s) {
				t.Fatalf("%s: error %q does not say %q", what, err, s)
			}
		}
	}

	t.Run("OpenFindsThePooler", func(t *testing.T) {
		_, err := postgres.Open(ctx, b.URL, postgres.Config{Schema: schema})
		wantErr(t, "Open through PgBouncer, pooler not named", err,
			"postgres store at "+b.Addr, "connection pooler", "cache_statement", "postgres.PoolerTransaction", "once_pooler=transaction", "default_query_exec_mode=exec")
	})

	t.Run("MigrateFindsThePooler", func(t *testing.T) {
		p := pooledPool(t, b.URL)
		s, err := postgres.New(p, postgres.Config{Schema: schema})
		if err != nil {
			t.Fatalf("New does no I/O and cannot tell; it refused: %v", err)
		}
		defer s.Close()
		wantErr(t, "Migrate through PgBouncer, pooler not named", s.Migrate(ctx),
			"connection pooler", "postgres.PoolerTransaction", "default_query_exec_mode=exec")
	})

	t.Run("NamedPoolerWithStatementCache", func(t *testing.T) {
		_, err := postgres.Open(ctx, b.URL+"&default_query_exec_mode=cache_statement", postgres.Config{Schema: schema, Pooler: postgres.PoolerTransaction})
		wantErr(t, "Open with cache_statement named", err, "cache_statement", "default_query_exec_mode=exec")
		p := pooledPool(t, b.URL)
		_, err = postgres.New(p, postgres.Config{Schema: schema, Pooler: postgres.PoolerTransaction})
		wantErr(t, "New over a pool in cache_statement", err, "Config.Pooler is transaction", "cache_statement", "pgx.QueryExecModeExec")
	})

	t.Run("NamedPoolerOpensInExec", func(t *testing.T) {
		s, err := postgres.Open(ctx, b.URL+"&pool_max_conns=4", postgres.Config{Schema: schema, Pooler: postgres.PoolerTransaction})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if m := s.Pool().Config().ConnConfig.DefaultQueryExecMode; m != pgx.QueryExecModeExec {
			t.Fatalf("mode = %v, want exec", m)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		c, err := once.New(once.Config{Store: s})
		if err != nil {
			t.Fatal(err)
		}
		// Many claims at once, over every client and server connection:
		// what the statement cache fails at.
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := range 40 {
			wg.Go(func() {
				in := once.Intent{Run: "r", Kind: "k", Target: fmt.Sprint(i)}
				_, err := once.Do(ctx, c, in, func(context.Context, once.Attempt) (int, error) { return i, nil })
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("UnknownPooler", func(t *testing.T) {
		p := pooledPool(t, b.URL+"&default_query_exec_mode=exec")
		for pooler, says := range map[postgres.Pooler]string{"statement": "allows no transaction", "pgbouncer": `"pgbouncer" is not a pooler mode`} {
			_, err := postgres.New(p, postgres.Config{Pooler: pooler})
			wantErr(t, string(pooler), err, says)
		}
		for name, says := range map[string]string{"statement": "allows no transaction", "bouncy": `"bouncy"`} {
			_, err := postgres.ParsePooler(name)
			wantErr(t, name, err, says)
		}
	})
}

// TestPoolerNotSeenInAProxy: a TCP proxy passes the connection's
// process id through: no pooler, and pgx's default mode is kept.
func TestPoolerNotSeenInAProxy(t *testing.T) {
	cfg, err := pgx.ParseConfig(testdb.RequirePostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := postgres.Open(context.Background(), fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&pool_max_conns=2", cfg.User, p.Addr(), cfg.Database), postgres.Config{})
	if err != nil {
		t.Fatalf("Open through a TCP proxy: %v", err)
	}
	defer s.Close()
	if m := s.Pool().Config().ConnConfig.DefaultQueryExecMode; m != pgx.QueryExecModeCacheStatement {
		t.Fatalf("mode = %v, want pgx's default kept", m)
	}
}

// pooledPool is a small pool on url, closed when the test ends.
func pooledPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	p, err := openPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestPoolerLostStatementIsNoRefusal: a store whose pool prepares
// statements through a pooler in transaction mode, the pooler not named
// and Migrate not run (New cannot tell), gets 42P05 when another client
// prepared the same statement on the server connection it is lent. The
// error says what to set, and is no refusal of the data: were it one,
// the engine would record a placeholder in place of a real outcome.
func TestPoolerLostStatementIsNoRefusal(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{PoolSize: 1})
	ctx := context.Background()
	schema := uniqueSchema("once_pooled_")
	dropSchema(t, schema)
	safe, err := postgres.Open(ctx, b.URL+"&pool_max_conns=2", postgres.Config{Schema: schema, Pooler: postgres.PoolerTransaction})
	if err != nil {
		t.Fatal(err)
	}
	defer safe.Close()
	if err := safe.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var stores []*postgres.Store
	for range 2 {
		s, err := postgres.New(pooledPool(t, b.URL), postgres.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	tr := once.Transition{Key: "0000", Attempt: 1, From: []once.Status{once.StatusInFlight}, To: once.StatusSucceeded}
	if _, err := stores[0].Transition(ctx, tr); err != nil {
		t.Fatal(err)
	}
	_, err = stores[1].Transition(ctx, tr)
	if err == nil || !strings.Contains(err.Error(), "42P05") {
		t.Fatalf("the second store's transition = %v; want 42P05 from the one server connection", err)
	}
	if errors.Is(err, once.ErrRejected) {
		t.Fatalf("a lost prepared statement matches ErrRejected: %v", err)
	}
	for _, s := range []string{"pooler in transaction mode", "default_query_exec_mode=exec", "postgres.PoolerTransaction"} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not say %q", err, s)
		}
	}
}

// TestPoolerSessionMode: PgBouncer in session mode keeps a server
// connection per client, so pgx's default mode and LISTEN work once the
// pooler is named.
func TestPoolerSessionMode(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{PoolMode: "session"})
	ctx := context.Background()
	schema := uniqueSchema("once_pooled_")
	dropSchema(t, schema)
	if _, err := postgres.Open(ctx, b.URL, postgres.Config{Schema: schema}); err == nil || !strings.Contains(err.Error(), "PoolerSession") {
		t.Fatalf("Open through a pooler not named = %v; want an error naming PoolerSession", err)
	}
	s, err := postgres.Open(ctx, b.URL+"&pool_max_conns=2", postgres.Config{Schema: schema, Pooler: postgres.PoolerSession})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if m := s.Pool().Config().ConnConfig.DefaultQueryExecMode; m != pgx.QueryExecModeCacheStatement {
		t.Fatalf("mode = %v, want pgx's default kept", m)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	postgres.SetPollInterval(s, time.Hour)
	listening(t, s)
	c, waits := client(t, s)
	f := startFirst(t, c, waitIntent)
	second := goDo(ctx, c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
	recv(t, waits, "the duplicate waiting")
	eventually(t, "the duplicate marking the row", func() bool { return marked(t, schema, keyOf(t, waitIntent)) })
	f.finish("notified")
	wantReplay(t, recv(t, second, "the duplicate woken through the pooler"), "notified")
}

// TestPoolerWaiters: with the pooler in transaction mode named and no
// ListenURL, the store opens no listening connection, its waiters poll,
// and it says so once; with a ListenURL to the server itself, waiters
// are woken by notifications that the pooled statements send.
func TestPoolerWaiters(t *testing.T) {
	b := testdb.RequirePgBouncer(t, testdb.PgBouncerOptions{})
	ctx := context.Background()

	t.Run("PollOnly", func(t *testing.T) {
		schema := uniqueSchema("once_pooled_")
		dropSchema(t, schema)
		var log bytes.Buffer
		var mu sync.Mutex
		s, err := postgres.Open(ctx, b.URL+"&pool_max_conns=4", postgres.Config{Schema: schema, Pooler: postgres.PoolerTransaction,
			Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &log}, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		c, waits := client(t, s)
		for i, v := range []string{"polled", "polled again"} {
			in := waitIntent
			in.Target = fmt.Sprint(i)
			f := startFirst(t, c, in)
			second := goDo(ctx, c, in, mustNotRun(t), once.WaitFor(time.Hour))
			recv(t, waits, "the duplicate waiting")
			f.finish(v)
			wantReplay(t, recv(t, second, "the duplicate polling"), v)
			if postgres.ListenerPID(s) != 0 || marked(t, schema, keyOf(t, in)) {
				t.Fatal("the store listened, or marked a row, through a pooler in transaction mode")
			}
		}
		mu.Lock()
		text := log.String()
		mu.Unlock()
		if n := strings.Count(text, "waiters poll"); n != 1 || !strings.Contains(text, "Config.ListenURL") {
			t.Fatalf("the store said %d times that its waiters poll, want once, naming ListenURL:\n%s", n, text)
		}
	})

	t.Run("ListenURL", func(t *testing.T) {
		schema := uniqueSchema("once_pooled_")
		dropSchema(t, schema)
		s, err := postgres.Open(ctx, b.URL+"&pool_max_conns=4", postgres.Config{Schema: schema, Pooler: postgres.PoolerTransaction,
			ListenURL: testdb.PostgresURL()})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		postgres.SetPollInterval(s, time.Hour)
		listening(t, s)
		c, waits := client(t, s)
		f := startFirst(t, c, waitIntent)
		second := goDo(ctx, c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
		recv(t, waits, "the duplicate waiting")
		eventually(t, "the duplicate marking the row", func() bool { return marked(t, schema, keyOf(t, waitIntent)) })
		f.finish("notified")
		wantReplay(t, recv(t, second, "the duplicate woken"), "notified")
	})

	// Not named, in a mode that prepares nothing: the store cannot tell
	// the pooler's mode, listens through it, finds its own notification
	// lost, and polls.
	t.Run("NotNamed", func(t *testing.T) {
		schema := uniqueSchema("once_pooled_")
		dropSchema(t, schema)
		s, err := postgres.Open(ctx, b.URL+"&pool_max_conns=4&default_query_exec_mode=exec", postgres.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		postgres.SetListenTimings(s, time.Minute, 200*time.Millisecond)
		if err := s.Wait(ctx, once.WaitRequest{Key: "warm-up", Until: time.Now().Add(10 * time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the self-check failing", func() bool { return postgres.ListenerUnavailable(s) })
		c, waits := client(t, s)
		f := startFirst(t, c, waitIntent)
		second := goDo(ctx, c, waitIntent, mustNotRun(t), once.WaitFor(time.Hour))
		recv(t, waits, "the duplicate waiting")
		f.finish("polled")
		wantReplay(t, recv(t, second, "the duplicate polling"), "polled")
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
