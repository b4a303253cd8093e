// Package testdb finds the databases the tests talk to. Tests use real
// servers; where one cannot be reached they skip with a message that says
// how to start it, except under CI=true, where they fail.
package testdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPostgresURL is the machine's PostgreSQL, as the README describes.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// PostgresURL returns ONCE_TEST_DATABASE_URL, or the default.
func PostgresURL() string {
	return cmp.Or(os.Getenv("ONCE_TEST_DATABASE_URL"), DefaultPostgresURL)
}

// pgProbe connects once per test binary.
var pgProbe = sync.OnceValue(func() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := RetryTooManyClients(ctx, func() (*pgx.Conn, error) { return pgx.Connect(ctx, PostgresURL()) })
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
})

// RequirePostgres skips (or, under CI, fails) the test when PostgreSQL
// cannot be reached, and returns its URL.
func RequirePostgres(t testing.TB) string {
	t.Helper()
	url := PostgresURL()
	if err := pgProbe(); err != nil {
		msg := "PostgreSQL is not reachable at " + url + " (" + err.Error() + "); start it with " +
			"'pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start' or set ONCE_TEST_DATABASE_URL"
		Unavailable(t, msg)
	}
	return url
}

// RetryTooManyClients calls open until it succeeds, fails for another
// reason than the server's connection limit, or ctx ends. The test
// server is shared (max_connections 100) by every package under test and
// by other checkouts, so the limit can be reached for a moment; opening
// a pool or a connection waits for a slot instead of failing the test.
func RetryTooManyClients[T any](ctx context.Context, open func() (T, error)) (T, error) {
	backoff := 50 * time.Millisecond
	for {
		v, err := open()
		if err == nil || !TooManyClients(err) {
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

// TooManyClients reports whether err is PostgreSQL refusing a connection
// because max_connections is reached (SQLSTATE 53300).
func TooManyClients(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "53300"
	}
	return strings.Contains(err.Error(), "too many clients") || strings.Contains(err.Error(), "53300")
}

// Warm opens every connection pool may hold, waiting out the server's
// connection limit (see RetryTooManyClients), and puts them back idle. A
// process that must not fail halfway, such as a test's worker, meets the
// limit when it starts, where waiting is harmless, and not at its first
// concurrent query, where a refused connection fails it. The pool's
// MaxConns should be small; its connections stay open.
func Warm(ctx context.Context, pool *pgxpool.Pool) error {
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range pool.Config().MaxConns {
		c, err := RetryTooManyClients(ctx, func() (*pgxpool.Conn, error) { return pool.Acquire(ctx) })
		if err != nil {
			return err
		}
		held = append(held, c)
	}
	return nil
}

// Unavailable skips the test for want of a service or a tool, named in
// msg with how to get it; under CI (CI=true) it fails instead, so a
// missing service never passes for a green run.
func Unavailable(t testing.TB, msg any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
