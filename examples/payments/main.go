// Command payments is a small charge API that makes one charge per
// Idempotency-Key, however often a client retries and whatever dies in
// between:
//
//	go run ./examples/payments --addr 127.0.0.1:8088 [--db URL]
//
//	POST /charges        {"amount":1250,"currency":"EUR","customer":"cus_ada"}
//	                     with an Idempotency-Key header: 201 and the charge
//	GET  /charges        the tenant's charges
//	GET  /charges/{id}   one charge
//
// POST /charges runs behind idemhttp.Middleware with the key required: a
// repeat gets the first answer back, marked Idempotent-Replayed: true; a
// repeat with another charge in its body is refused with 422; a request
// without a key with 400. A body that is not a valid charge is refused
// (400 or 422) before the key is looked at, so it changes nothing.
//
// The charges live in the same database as once's action log, a SQLite
// file by default (once-payments.db in the temporary directory) or
// PostgreSQL with --db postgres://…. README.md shows a session with curl
// and explains what happens when the process dies between a charge and
// its record.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/sqlite"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// defaultDB is the SQLite file used without --db: in the temporary
// directory, so a fresh machine needs nothing set up and a checkout is
// not written to, and the same file across runs, so a restart finds its
// charges.
func defaultDB() string { return filepath.Join(os.TempDir(), "once-payments.db") }

// run is the command; it returns the exit code: 2 for a usage error, 1
// when the store cannot be opened or the address taken.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8088", "listen on `HOST:PORT`; port 0 takes a free one (the address is printed)")
	db := fs.String("db", defaultDB(), "the database `URL`: postgres://user@host:5432/db (once_schema=NAME places the tables), or a SQLite file path")
	lease := fs.Duration("lease", 10*time.Second, "how long a charge's claim outlives a process that died holding it; a retry after that runs the charge again, which finds the charge it wrote")
	hold := fs.Duration("hold-after-charge", 0, "wait this long between writing a charge and answering it, to watch a crash in that window (see README.md)")
	maxConns := fs.Int("max-conns", 1024, "serve at most `N` connections at once; more wait to be accepted")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "payments: unexpected argument %q; the options are flags (payments -h lists them)\n", fs.Arg(0))
		return 2
	case *lease < 100*time.Millisecond:
		fmt.Fprintf(stderr, "payments: --lease %v is too short; give at least 100ms (10s is a good default)\n", *lease)
		return 2
	case *hold < 0:
		fmt.Fprintf(stderr, "payments: --hold-after-charge must not be negative\n")
		return 2
	case *maxConns < 1:
		fmt.Fprintf(stderr, "payments: --max-conns %d: give at least 1 (1024 is a good default)\n", *maxConns)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if err := serve(ctx, *addr, *db, *lease, *hold, *maxConns, stdout, log); err != nil {
		fmt.Fprintln(stderr, "payments:", dburl.Redact(err.Error()))
		return 1
	}
	return 0
}

// Bounds on what one connection may hold. A request is a few headers
// and a body of at most maxBody: a client that takes longer than this
// to send it is cut, so slow clients cannot hold connections, and the
// goroutines and buffers behind them, for as long as they like.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	idleTimeout       = 30 * time.Second
	maxHeaderBytes    = 16 << 10
	// maxExecution bounds a charge's work: the middleware keeps it
	// running past a client that left, until this.
	maxExecution = 30 * time.Second
)

// serve opens the store, makes the tables, and serves until ctx ends.
func serve(ctx context.Context, addr, db string, lease, hold time.Duration, maxConns int, stdout io.Writer, log *slog.Logger) error {
	store, charges, err := open(ctx, db)
	if err != nil {
		return err
	}
	defer store.Close()
	client, err := once.New(once.Config{
		Store:  store,
		Logger: log,
		Kinds: map[string]once.KindPolicy{
			// Writing a charge is safe to run again (the charges table
			// keeps one per key), so a claim whose process died is
			// released for the client's retry rather than put up for a
			// person to review.
			kindCreateCharge: {Recovery: once.RetryWithProviderKey, Lease: lease, MaxExecution: maxExecution + hold},
		},
	})
	if err != nil {
		return err
	}
	a := &api{charges: charges, hold: hold, log: log}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%w; pass another --addr (port 0 takes a free one)", err)
	}
	srv := &http.Server{
		Handler:           a.handler(client),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		// Past the longest a charge may take, so its answer still goes
		// out.
		WriteTimeout:   readTimeout + maxExecution + hold + 5*time.Second,
		IdleTimeout:    idleTimeout,
		MaxHeaderBytes: maxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	fmt.Fprintf(stdout, "payments: listening on http://%s (%s, pid %d)\n", ln.Addr(), store.Name, os.Getpid())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(limitListener(ln, maxConns, log)) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// Let the requests in progress finish, so their answers are
	// recorded; a charge cut off here is recovered like a crash.
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// open opens the store db names, as the once command does (a
// postgres:// URL, or a SQLite file path), migrates it, and makes the
// charges table beside once's tables, in the same database.
func open(ctx context.Context, db string) (*dburl.Store, *chargeTable, error) {
	store, err := dburl.Open(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	var charges *chargeTable
	postgresStore := false
	switch s := store.Store.(type) {
	case *sqlite.Store:
		charges = newSQLiteCharges(s.DB())
	case *postgres.Store:
		// Beside once's tables: in the schema the URL's once_schema
		// names (dburl.Open checked it), public by default.
		u, _ := neturl.Parse(db)
		schema := u.Query().Get("once_schema")
		if schema == "" {
			schema = "public"
		}
		charges = newPostgresCharges(stdlib.OpenDBFromPool(s.Pool()), schema)
		postgresStore = true
	default:
		store.Close()
		return nil, nil, fmt.Errorf("%s: this example knows only the sqlite and postgres stores", store.Name)
	}
	if err := store.Migrate(ctx); err != nil {
		store.Close()
		return nil, nil, err
	}
	if err := charges.migrate(ctx, postgresStore); err != nil {
		store.Close()
		return nil, nil, fmt.Errorf("%s: creating the charges table: %w", store.Name, err)
	}
	return store, charges, nil
}

// limitListener accepts at most n connections at a time: past that,
// Accept waits for one to close, and new connections wait in the
// kernel's queue rather than each taking a goroutine and buffers. It
// says so in the log when it is full, at most once a minute.
func limitListener(ln net.Listener, n int, log *slog.Logger) net.Listener {
	return &limited{Listener: ln, slots: make(chan struct{}, n), log: log}
}

type limited struct {
	net.Listener
	slots  chan struct{}
	log    *slog.Logger
	warned atomic.Int64 // when the log last said it was full, in Unix ns
}

func (l *limited) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		if now, last := time.Now().UnixNano(), l.warned.Load(); now-last > int64(time.Minute) && l.warned.CompareAndSwap(last, now) {
			l.log.Warn("payments: connection limit reached; new connections wait to be accepted", "max_conns", cap(l.slots))
		}
		l.slots <- struct{}{}
	}
	conn, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: conn, release: func() { <-l.slots }}, nil
}

// limitedConn gives its slot back when it is closed, once.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
