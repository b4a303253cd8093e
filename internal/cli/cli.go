// Package cli is the `once` command: each subcommand is a function over
// its flags and a database, so main stays a line long and the tests run
// the same code the binary does.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/internal/demo"
	"github.com/oncehq/once/internal/migrate"
)

// DefaultDatabase is the embedded SQLite file used when neither --db nor
// ONCE_DATABASE_URL names a database, so every command works on a fresh
// machine with no server.
const DefaultDatabase = "once.db"

// env is what a command runs with.
type env struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
}

type command struct {
	name, args, help string
	run              func(e env, args []string) error
}

func commands() []command {
	return []command{
		{"demo", "[--json] [--smtp HOST:PORT] [--intents N] [--workers N]", "run the duplicate-email story for real: naive check-then-send against once, with workers killed mid-send", runDemo},
		{"migrate", "[--print]", "create or upgrade the schema (idempotent); --print shows the SQL instead", runMigrate},
		{"key", "--run R --step N --kind K [--target T] [--payload-file F] [--payload-in-key]", "print an intent's key and payload fingerprint", runKey},
		{"ls", "[--status S] [--kind K] [--run R] [--since D] [--limit N] [--json]", "list actions, newest first", runLs},
		{"show", "KEY [--json]", "show one action and its event trail", runShow},
		{"resolve", "KEY (--done [--result JSON] | --retry | --abandon) --note TEXT [--by NAME]", "record a person's decision on an action in review", runResolve},
		{"reap", "[--every 30s] [--json]", "recover actions whose worker died: one pass, or a loop", runReap},
		{"purge", "[--older-than D] [--dry-run]", "delete finished actions past their retention", runPurge},
		{"serve", "[--addr 127.0.0.1:7070] [--token T]", "the web console, JSON API, /metrics, /healthz and the reaper", runServe},
	}
}

// Main runs the command line args and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if demo.IsWorker() {
		return demo.WorkerMain(stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := env{ctx: ctx, stdout: stdout, stderr: stderr}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(e, args[1:])
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			if err != nil {
				// One line: drivers' messages may span several.
				msg := strings.Join(strings.Fields(err.Error()), " ")
				fmt.Fprintln(stderr, "once "+c.name+": "+msg)
				var ue usageError
				if errors.As(err, &ue) {
					fmt.Fprintf(stderr, "usage: once %s %s\n", c.name, c.args)
				}
				return 1
			}
			return 0
		}
	}
	fmt.Fprintf(stderr, "once: unknown command %q; run 'once help' for the list\n", args[0])
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "once makes external side effects happen exactly once on top of at-least-once queues.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "usage: once COMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.help)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "The database is --db, or $ONCE_DATABASE_URL, or ./%s: postgres://… for PostgreSQL,\n", DefaultDatabase)
	fmt.Fprintln(w, "a file path or sqlite:PATH for SQLite. 'once COMMAND -h' shows a command's flags.")
}

// usageError marks an error in the command line itself.
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// flags returns a flag set that reports errors instead of exiting, with
// the --db flag every command shares.
func flags(e env, name string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("once "+name, flag.ContinueOnError)
	// Errors are reported by Main, in one line; -h prints the flags.
	fs.SetOutput(io.Discard)
	db := fs.String("db", "", "database: postgres://… or a SQLite file path (default $ONCE_DATABASE_URL or ./"+DefaultDatabase+")")
	return fs, db
}

// parse parses args, allowing flags after positional arguments (once
// show KEY --json), and returns the positional ones.
func (e env) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(e.stdout, "usage of %s:\n", fs.Name())
				fs.SetOutput(e.stdout)
				fs.PrintDefaults()
				return nil, err
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// dbURL picks the database the way usage says.
func dbURL(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if u := os.Getenv("ONCE_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultDatabase
}

// openStore opens the database named by url. For every command but
// migrate and demo, the schema must already be there: a missing file or
// schema is one clear line saying to run `once migrate`, and nothing is
// written.
func openStore(ctx context.Context, url string, forWrite bool) (*dburl.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if path, ok := dburl.SQLitePath(url); ok && !forWrite && path != "" {
		// Look before opening: opening a SQLite file for writing changes
		// it, and a command that fails must leave it as it was.
		abs, _ := filepath.Abs(path)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no database at %s; run 'once migrate' to create one (or 'once demo' to fill one), or pass --db", abs)
		}
		has, err := dburl.HasSQLiteSchema(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("sqlite store at %s: %w", abs, err)
		}
		if !has {
			return nil, fmt.Errorf("sqlite store at %s has no once schema; run 'once migrate --db %s' first", abs, url)
		}
	}
	s, err := dburl.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	if forWrite {
		return s, nil
	}
	latest, err := latestVersion(s)
	if err != nil {
		s.Close()
		return nil, err
	}
	v, err := s.Version(ctx)
	switch {
	case err != nil:
	case v == 0:
		err = fmt.Errorf("%s has no once schema; run 'once migrate --db %s' first", s.Name, url)
	case v < latest:
		err = fmt.Errorf("%s has schema version %d and this once needs %d; run 'once migrate --db %s'", s.Name, v, latest, url)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func latestVersion(s *dburl.Store) (int, error) {
	ms, err := s.Migrations()
	return len(ms), err
}

// joinSQL renders migrations as one script for users' own tools.
func joinSQL(ms []migrate.Migration, err error) (string, error) {
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "-- %03d_%s\n%s\n", m.Version, m.Name, strings.TrimSpace(m.SQL))
	}
	return b.String(), nil
}

// client builds a client over the store with the package defaults.
func client(s once.Store) (*once.Client, error) {
	return once.New(once.Config{Store: s})
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
