// Package dburl opens a store from the database URL the command takes:
// postgres://… for PostgreSQL, a file path or sqlite:PATH for SQLite.
package dburl

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"regexp"
	"strings"

	"github.com/oncehq/once"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/sqlite"
	"github.com/oncehq/once/storekit"
)

// Store is an opened store with what the command needs beside it.
type Store struct {
	once.Store
	// Name says which store and where, for messages.
	Name string
}

// Versions returns the migration versions the schema records (see
// once.Migrator).
func (s *Store) Versions(ctx context.Context) ([]int, error) {
	m, ok := s.Store.(once.Migrator)
	if !ok {
		return nil, fmt.Errorf("%s cannot list its schema's versions (it is no once.Migrator)", s.Name)
	}
	return m.Versions(ctx)
}

// MigrateApplied migrates the schema and returns the migrations this
// call ran, none when another migrator ran them first (see
// once.Migrator).
func (s *Store) MigrateApplied(ctx context.Context) ([]once.Migration, error) {
	m, ok := s.Store.(once.Migrator)
	if !ok {
		return nil, fmt.Errorf("%s cannot say which migrations it applied (it is no once.Migrator)", s.Name)
	}
	return m.MigrateApplied(ctx)
}

// IsPostgres reports whether url names a PostgreSQL database.
func IsPostgres(url string) bool {
	return strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://")
}

// SQLitePath returns the file a SQLite URL names, and false for any other
// URL, and for what is plainly meant for a server: a scheme, a
// postgres: URL missing a slash, or a key=value connection string (host=…
// user=… password=…), which must not become a file named after it.
func SQLitePath(url string) (string, bool) {
	if IsPostgres(url) || strings.Contains(url, "://") || MeantForServer(url) {
		return "", false
	}
	return strings.TrimPrefix(url, "sqlite:"), true
}

// dsnRE finds the key=value pairs of a connection string.
var dsnRE = regexp.MustCompile(`(?i)(^|\s)(host|hostaddr|port|dbname|user|password|sslmode|service)=`)

// MeantForServer reports a database argument that names a server in a
// form the command does not take: postgres:/… with a slash missing, or a
// key=value connection string.
func MeantForServer(url string) bool {
	l := strings.ToLower(url)
	return strings.HasPrefix(l, "postgres:") || strings.HasPrefix(l, "postgresql:") || dsnRE.MatchString(url)
}

// postgresConfig takes the store's own parameters, once_schema,
// once_prefix and once_pooler, out of a PostgreSQL URL; the rest go to
// the driver. A query that does not parse, or a schema or prefix the
// store cannot use, is an error: dropping it would put the tables
// somewhere else.
func postgresConfig(raw string) (string, postgres.Config, error) {
	u, err := neturl.Parse(raw)
	if err != nil {
		return "", postgres.Config{}, errors.New("postgres store: the URL is not valid; expected postgres://user@host:5432/dbname")
	}
	q, err := neturl.ParseQuery(u.RawQuery)
	if err != nil {
		return "", postgres.Config{}, fmt.Errorf("postgres store: the URL's query does not parse (%v); write its parameters as name=value joined by &, with %%, & and ; in a value percent-encoded (%%25, %%26, %%3B)", err)
	}
	cfg := postgres.Config{Schema: q.Get("once_schema"), Prefix: q.Get("once_prefix")}
	if err := storekit.CheckSchema("once_schema", cfg.Schema, !q.Has("once_schema")); err != nil {
		return "", postgres.Config{}, fmt.Errorf("postgres store: %w; fix it in the URL", err)
	}
	if err := storekit.CheckIdent("once_prefix", cfg.Prefix, !q.Has("once_prefix")); err != nil {
		return "", postgres.Config{}, fmt.Errorf("postgres store: %w; fix it in the URL", err)
	}
	pooler, err := postgres.ParsePooler(q.Get("once_pooler"))
	if err != nil {
		return "", postgres.Config{}, fmt.Errorf("%w; fix once_pooler in the URL", err)
	}
	cfg.Pooler = pooler
	q.Del("once_schema")
	q.Del("once_prefix")
	q.Del("once_pooler")
	u.RawQuery = q.Encode()
	return u.String(), cfg, nil
}

var (
	// userinfoRE finds the password of a URL's user:password@, up to
	// the last @ before the host (a password may hold an unencoded @),
	// with one or two slashes after the scheme.
	userinfoRE = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*:/{1,2}[^:/?#@\s]*):[^/?#\s]*@`)
	// passwordRE finds a parameter whose name holds "password"
	// (password=, sslpassword=, pass%77ord= once decoded), in a URL's
	// query or a key=value connection string.
	passwordRE = regexp.MustCompile(`(?i)(\b[a-z_]*pass(?:word|%77ord)=)('[^']*'|[^&\s']*)`)
)

// Redact elides the passwords of any database URL in s (user:password@
// becomes user:…@, password=secret becomes password=…), so a message
// that quotes the URL, or a driver's error that does, can be printed.
func Redact(s string) string {
	s = userinfoRE.ReplaceAllString(s, "$1:…@")
	return passwordRE.ReplaceAllString(s, "${1}…")
}

// Open opens the store url names. A PostgreSQL URL may carry
// once_schema and once_prefix to place the tables, and once_pooler
// (transaction, session) to say what pools its connections. It checks
// the connection, so an unreachable server is reported here, by
// address.
func Open(ctx context.Context, url string) (*Store, error) {
	return open(ctx, url, false)
}

// OpenReadOnly opens the store url names for commands that only read: a
// SQLite file is opened read-only (sqlite.Config.ReadOnly), so reading it
// takes no lock and leaves no file behind. A PostgreSQL store is opened
// as by Open.
func OpenReadOnly(ctx context.Context, url string) (*Store, error) {
	return open(ctx, url, true)
}

func open(ctx context.Context, url string, readOnly bool) (*Store, error) {
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
		return nil, unsupported(url)
	}
	if path == "" {
		return nil, errors.New("the SQLite path is empty; pass --db ./once.db")
	}
	s, err := sqlite.Open(path, sqlite.Config{ReadOnly: readOnly})
	if err != nil {
		return nil, err
	}
	return &Store{Store: s, Name: s.String()}, nil
}

// unsupported says why url names no store the command can open, without
// quoting what may hold a password.
func unsupported(url string) error {
	if MeantForServer(url) {
		return errors.New("the database argument looks like a PostgreSQL connection string (postgres:/ with a slash missing, or host=… user=…); write it as a URL: postgres://user@host:5432/db")
	}
	scheme, _, _ := strings.Cut(url, "://")
	return fmt.Errorf("database URL scheme %q is not supported; use postgres://user@host:5432/db, or a SQLite file path", scheme)
}

// Migrations returns the schema migrations rendered for the store url
// names (its once_schema and once_prefix), without connecting to it or
// creating anything.
func Migrations(url string) ([]once.Migration, error) {
	if IsPostgres(url) {
		_, cfg, err := postgresConfig(url)
		if err != nil {
			return nil, err
		}
		return postgres.Migrations(cfg)
	}
	if _, ok := SQLitePath(url); !ok {
		return nil, unsupported(url)
	}
	return sqlite.Migrations(sqlite.Config{})
}

// HasSQLiteSchema reports, through a read-only store that changes
// nothing, whether the SQLite file at path holds once's tables.
func HasSQLiteSchema(ctx context.Context, path string) (bool, error) {
	s, err := sqlite.Open(path, sqlite.Config{ReadOnly: true})
	if err != nil {
		return false, err
	}
	defer s.Close()
	vs, err := s.Versions(ctx)
	return len(vs) > 0, err
}
