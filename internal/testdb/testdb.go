// Package testdb finds the databases the tests talk to. Tests use real
// servers; where one cannot be reached they skip with a message that says
// how to start it, except under CI=true, where they fail.
package testdb

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultPostgresURL is the machine's PostgreSQL, as the README describes.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// PostgresURL returns ONCE_TEST_DATABASE_URL, or the default.
func PostgresURL() string {
	if u := os.Getenv("ONCE_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultPostgresURL
}

var (
	pgOnce sync.Once
	pgErr  error
)

// RequirePostgres skips (or, under CI, fails) the test when PostgreSQL
// cannot be reached, and returns its URL.
func RequirePostgres(t testing.TB) string {
	t.Helper()
	url := PostgresURL()
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			pgErr = err
			return
		}
		pgErr = conn.Ping(ctx)
		conn.Close(ctx)
	})
	if pgErr != nil {
		msg := "PostgreSQL is not reachable at " + url + " (" + pgErr.Error() + "); start it with " +
			"'pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start' or set ONCE_TEST_DATABASE_URL"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return url
}
