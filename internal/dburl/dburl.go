// Package dburl opens a store from the database URL the command takes:
// postgres://… for PostgreSQL, a file path or sqlite:PATH for SQLite.
package dburl

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/migrate"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/sqlite"
)

// Store is an opened store with what the command needs beside it.
type Store struct {
	once.Store
	// Name says which store and where, for messages.
	Name string
	// Migrations are the store's schema migrations, rendered.
	Migrations func() ([]migrate.Migration, error)
	close      func()
}

// Close releases the store.
func (s *Store) Close() { s.close() }

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

// Open opens the store url names. It checks the connection, so an
// unreachable server is reported here, by address.
func Open(ctx context.Context, url string) (*Store, error) {
	if IsPostgres(url) {
		s, err := postgres.Open(ctx, url, postgres.Config{})
		if err != nil {
			return nil, err
		}
		return &Store{Store: s, Name: s.String(), Migrations: s.Migrations, close: s.Close}, nil
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
	return &Store{Store: s, Name: s.String(), Migrations: s.Migrations, close: func() { s.Close() }}, nil
}
