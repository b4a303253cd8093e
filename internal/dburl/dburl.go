// Package dburl opens a store from the database URL the command takes:
// postgres://… for PostgreSQL, a file path or sqlite:PATH for SQLite.
package dburl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	neturl "net/url"
	"strings"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/sqlite"
)

// Store is an opened store with what the command needs beside it.
type Store struct {
	once.Store
	// Name says which store and where, for messages.
	Name string
}

// Versions returns the migration versions the schema records (see
// postgres.Store.Versions and sqlite.Store.Versions).
func (s *Store) Versions(ctx context.Context) ([]int, error) {
	v, ok := s.Store.(interface {
		Versions(context.Context) ([]int, error)
	})
	if !ok {
		return nil, fmt.Errorf("%s cannot list its schema's versions", s.Name)
	}
	return v.Versions(ctx)
}

// IsPostgres reports whether url names a PostgreSQL database.
func IsPostgres(url string) bool {
	return strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://")
}

// SQLitePath returns the file a SQLite URL names, and false for any other
// URL.
func SQLitePath(url string) (string, bool) {
	if IsPostgres(url) || strings.Contains(url, "://") {
		return "", false
	}
	return strings.TrimPrefix(url, "sqlite:"), true
}

// postgresConfig takes the store's own parameters, once_schema and
// once_prefix, out of a PostgreSQL URL; the rest go to the driver.
func postgresConfig(raw string) (string, postgres.Config, error) {
	u, err := neturl.Parse(raw)
	if err != nil {
		return "", postgres.Config{}, errors.New("postgres store: the URL is not valid; expected postgres://user@host:5432/dbname")
	}
	q := u.Query()
	cfg := postgres.Config{Schema: q.Get("once_schema"), Prefix: q.Get("once_prefix")}
	q.Del("once_schema")
	q.Del("once_prefix")
	u.RawQuery = q.Encode()
	return u.String(), cfg, nil
}

// Open opens the store url names. A PostgreSQL URL may carry
// once_schema and once_prefix to place the tables. It checks the connection, so an
// unreachable server is reported here, by address.
func Open(ctx context.Context, url string) (*Store, error) {
	if IsPostgres(url) {
		url, cfg, err := postgresConfig(url)
		if err != nil {
			return nil, err
		}
		s, err := postgres.Open(ctx, url, cfg)
		if err != nil {
			return nil, err
		}
		return &Store{Store: s, Name: s.String()}, nil
	}
	path, ok := SQLitePath(url)
	if !ok {
		scheme, _, _ := strings.Cut(url, "://")
		return nil, fmt.Errorf("database URL scheme %q is not supported; use postgres://user@host:5432/db, or a SQLite file path", scheme)
	}
	if path == "" {
		return nil, errors.New("the SQLite path is empty; pass --db ./once.db")
	}
	s, err := sqlite.Open(path, sqlite.Config{})
	if err != nil {
		return nil, err
	}
	return &Store{Store: s, Name: s.String()}, nil
}

// HasSQLiteSchema reports, through a read-only connection that changes
// nothing, whether the SQLite file at path holds once's tables.
func HasSQLiteSchema(ctx context.Context, path string) (bool, error) {
	db, err := sql.Open("sqlite", "file:"+neturl.PathEscape(path)+"?mode=ro")
	if err != nil {
		return false, err
	}
	defer db.Close()
	var n int
	err = db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'once_migration'`).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("%w; is it an SQLite database?", err)
	}
	return n > 0, nil
}
