package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tooManyClients reports whether err is the server refusing a connection
// at max_connections. The server is shared, so the limit can be reached
// for a moment by someone else; such an error is waited out, not fatal.
// Some libraries wrap errors with %v, so the message is matched too.
func tooManyClients(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "53300"
	}
	return err != nil && (strings.Contains(err.Error(), "too many clients") ||
		strings.Contains(err.Error(), "SQLSTATE 53300"))
}

// retryTooManyClients calls open until it succeeds, fails for another
// reason than the connection limit, or ctx ends.
func retryTooManyClients[T any](ctx context.Context, open func() (T, error)) (T, error) {
	backoff := 50 * time.Millisecond
	for {
		v, err := open()
		if err == nil || !tooManyClients(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("%w (still at the server's connection limit when %v)", err, context.Cause(ctx))
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// admin is the run's own connection to the database named by --db: it
// creates and drops the contenders' databases and reads the server's
// counters.
type admin struct {
	conn *pgx.Conn
	url  string
}

func openAdmin(ctx context.Context, url string) (*admin, error) {
	if url == "" {
		return nil, errors.New("no database: pass --db postgres://user@host:5432/dbname")
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("--db is not a valid PostgreSQL URL (%v); expected postgres://user@host:5432/dbname", err)
	}
	cfg.RuntimeParams["application_name"] = "once-peers"
	conn, err := retryTooManyClients(ctx, func() (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) })
	if err != nil {
		return nil, fmt.Errorf("connecting to %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	return &admin{conn: conn, url: url}, nil
}

func (a *admin) close(ctx context.Context) error { return a.conn.Close(ctx) }

// createDatabase makes an empty database for one contender, so that its
// commit counter (pg_stat_database is kept per database) counts that
// contender's transactions and nobody else's.
func (a *admin) createDatabase(ctx context.Context, name string) error {
	if _, err := a.conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("creating database %s (the --db role needs CREATEDB): %w", name, err)
	}
	return nil
}

// dropDatabase removes a contender's database, ending any session still
// in it.
func (a *admin) dropDatabase(ctx context.Context, name string) error {
	if _, err := a.conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("dropping database %s: %w; drop it by hand", name, err)
	}
	return nil
}

// openPool opens a pool on database name of the --db server, of at most
// size connections. It connects lazily: the first Acquire opens the first
// connection.
func (a *admin) openPool(ctx context.Context, name string, size int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(a.url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Database = name
	cfg.ConnConfig.RuntimeParams["application_name"] = "once-peers"
	cfg.MaxConns = int32(size)
	cfg.MinConns = 0
	return pgxpool.NewWithConfig(ctx, cfg)
}

// counters are the server's figures that an arm's turn is charged with.
type counters struct {
	commits int64  // pg_stat_database.xact_commit of the contender's database
	lsn     string // pg_current_wal_lsn(), for the WAL written meanwhile
}

func (a *admin) counters(ctx context.Context, db string) (counters, error) {
	var c counters
	err := a.conn.QueryRow(ctx,
		`SELECT coalesce((SELECT xact_commit FROM pg_stat_database WHERE datname = $1), 0), pg_current_wal_lsn()::text`,
		db).Scan(&c.commits, &c.lsn)
	return c, err
}

// walSince returns the bytes of WAL written since lsn, by the whole
// server: WAL is not kept per database.
func (a *admin) walSince(ctx context.Context, lsn string) (int64, error) {
	var n int64
	err := a.conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, lsn).Scan(&n)
	return n, err
}

// settle closes the pool's idle connections and waits (at most two
// seconds) for their server processes to end. A backend reports its
// commits to pg_stat_database at most once a second while busy, and up
// to ten seconds late when idle, but always when it exits: once they are
// gone the counter holds every commit of the turn. Connections a library
// keeps acquired (a listener) stay, and are not waited for.
func (a *admin) settle(ctx context.Context, db string, pool *pgxpool.Pool) error {
	pool.Reset()
	deadline := time.Now().Add(2 * time.Second)
	for {
		var n int32
		err := a.conn.QueryRow(ctx,
			`SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db).Scan(&n)
		if err != nil {
			return err
		}
		if n <= pool.Stat().AcquiredConns() || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// warm opens n connections of pool at once, so that an arm's turn does
// not pay for connecting: the pool was emptied after the arm's last turn.
func warm(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			conns[i], errs[i] = retryTooManyClients(ctx, func() (*pgxpool.Conn, error) { return pool.Acquire(ctx) })
		})
	}
	wg.Wait()
	for _, c := range conns {
		if c != nil {
			c.Release()
		}
	}
	return errors.Join(errs...)
}
