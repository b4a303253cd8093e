// Package cli is the `once` command: each subcommand is a function over
// its flags and a database, so main stays a line long and the tests run
// the same code the binary does.
//
// Each command defines its flags once (command.define); its synopsis,
// its -h, the usage line printed with a mistake and the checks of
// required and alternative flags all come from that definition, and a
// test holds the README's command table to the same synopses.
//
// It is part of the lab module (github.com/oncehq/once/lab): the project's
// harnesses and tools, not a stable API; it may change in any release.
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
	"strings"
	"syscall"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/internal/view"
	"github.com/oncehq/once/lab/chaos"
	"github.com/oncehq/once/lab/demo"
	"github.com/oncehq/once/storekit"
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

// command is one subcommand.
type command struct {
	name string
	// args names the positional arguments, such as "KEY"; a command is
	// given exactly these.
	args []string
	help string
	// define defines the command's flags on fs and returns what runs the
	// command once they are parsed, with the positional arguments.
	define func(fs *flagSet) func(e env, args []string) error
	// rest, when set, takes everything after "--" as one command line
	// of another program (once mcp's upstream), its words given to the
	// command after the positional arguments, unparsed.
	rest bool
}

func commands() []command {
	return []command{
		{"demo", nil, "run the duplicate-email story for real: naive check-then-send against once, with workers killed mid-send", defineDemo, false},
		{"migrate", nil, "create or upgrade the schema (idempotent); --print shows the SQL instead", defineMigrate, false},
		{"key", nil, "print an intent's key and payload fingerprint", defineKey, false},
		{"ls", nil, "list actions, newest first", defineLs, false},
		{"show", []string{"KEY"}, "show one action and its event trail", defineShow, false},
		{"resolve", []string{"KEY"}, "record a person's decision on an action in review", defineResolve, false},
		{"approve", []string{"KEY"}, "approve an action awaiting approval: its next delivery runs it", defineApprove, false},
		{"reject", []string{"KEY"}, "reject an action awaiting approval: it fails without running", defineReject, false},
		{"reap", nil, "recover actions whose worker died: one pass, or a loop", defineReap, false},
		{"purge", nil, "delete finished actions past their retention", definePurge, false},
		{"serve", nil, "the web console, JSON API, /metrics, /healthz and the reaper", defineServe, false},
		{"chaos", nil, "prove it under failure: real queue, providers and workers, with kills, pauses, cut connections and broker restarts", defineChaos, false},
		{"bench", nil, "measure what once costs: Do against hand-written SQL, side by side on one PostgreSQL database, and on SQLite", defineBench, false},
		{name: "mcp", help: "front an MCP server so that each of an agent's tool calls is performed once: stdio or HTTP, upstream a command or a URL", define: defineMCP, rest: true},
	}
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// Main runs the command line args and returns the exit code. SIGINT and
// SIGTERM end a command that runs until stopped (serve, reap --every).
func Main(args []string, stdout, stderr io.Writer) int {
	if demo.IsWorker() {
		return demo.WorkerMain(stderr)
	}
	if chaos.IsWorker() {
		return chaos.WorkerMain(stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, stdout, stderr)
}

// Run runs the command line args until it is done or ctx ends, and
// returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := env{ctx: ctx, stdout: stdout, stderr: stderr}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) == 2 && args[0] == "help" {
			if c, ok := lookup(args[1]); ok {
				c.printHelp(stdout)
				return 0
			}
		}
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := lookup(args[0])
	if !ok {
		fmt.Fprintf(stderr, "once: unknown command %q; run 'once help' for the list\n", args[0])
		return 2
	}
	err := c.run(e, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		// One line: drivers' messages may span several. A password in
		// the database URL, quoted by a hint or by a driver, is elided.
		// Stored text an error quotes is made safe for the terminal.
		msg := view.Terminal(dburl.Redact(strings.Join(strings.Fields(err.Error()), " ")))
		fmt.Fprintln(stderr, "once "+c.name+": "+msg)
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(stderr, "usage: "+c.synopsis())
		}
		return 1
	}
	return 0
}

// run parses args against the command's flags, checks what the flags
// say must be given, and runs the command.
func (c command) run(e env, args []string) error {
	fs := newFlagSet(c.name)
	run := c.define(fs)
	var rest []string
	if c.rest {
		for i, a := range args {
			if a == "--" {
				args, rest = args[:i], args[i+1:]
				break
			}
		}
	}
	pos, err := parse(fs.FlagSet, args)
	if errors.Is(err, flag.ErrHelp) {
		c.printHelp(e.stdout)
		return err
	}
	if err != nil {
		return usageError{err.Error()}
	}
	switch {
	case len(pos) == len(c.args):
	case len(c.args) == 1:
		return usagef("give one %s", strings.ToLower(c.args[0]))
	case len(c.args) == 0:
		return usagef("takes no arguments, but was given %q", strings.Join(pos, " "))
	default:
		return usagef("give %s", strings.Join(c.args, " "))
	}
	if err := fs.check(); err != nil {
		return err
	}
	return run(e, append(pos, rest...))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "once makes external side effects happen exactly once on top of at-least-once queues.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "usage:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %s\n        %s\n", c.synopsis(), c.help)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "The database is --db, or $ONCE_DATABASE_URL, or ./%s: postgres://… for PostgreSQL,\n", DefaultDatabase)
	fmt.Fprintln(w, "a file path or sqlite:PATH for SQLite. 'once help COMMAND' or 'once COMMAND -h' shows a command's flags.")
}

// usageError marks an error in the command line itself.
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// parse parses args, allowing flags after positional arguments (once
// show KEY --json), and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
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

// openTimeout bounds opening a database and checking its schema: an
// unreachable server is an error, not a hang.
const openTimeout = 15 * time.Second

// database is an opened store and the client over it. Commands read and
// resolve through the client's API; the store is only closed.
type database struct {
	client *once.Client
	// name says which store and where, for messages.
	name  string
	store *dburl.Store
}

func (d *database) Close() error { return d.store.Close() }

// open opens the database url names and makes a client over it with cfg
// (whose Store it sets). The schema must already be there: a missing
// file or schema is one clear line saying to run `once migrate`, and
// nothing is written.
func open(ctx context.Context, url string, cfg once.Config) (*database, error) {
	return openDB(ctx, url, cfg, false)
}

// openReadOnly is open for commands that only read: a SQLite file is
// read without a lock a writer would wait for, and without creating its
// -wal and -shm files, which would be left owned by whoever ran the
// command.
func openReadOnly(ctx context.Context, url string, cfg once.Config) (*database, error) {
	return openDB(ctx, url, cfg, true)
}

func openDB(ctx context.Context, url string, cfg once.Config, readOnly bool) (*database, error) {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	openStore := dburl.Open
	if readOnly {
		openStore = dburl.OpenReadOnly
	}
	if path, ok := dburl.SQLitePath(url); ok && path != "" {
		// Look before opening: opening a SQLite file for writing changes
		// it, and a command that fails must leave it as it was.
		abs, _ := filepath.Abs(path)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no database at %s; run 'once migrate' to create one (or 'once demo' to fill one), or pass --db", abs)
		}
		if !readOnly {
			has, err := dburl.HasSQLiteSchema(ctx, path)
			if err != nil {
				return nil, err
			}
			if !has {
				return nil, fmt.Errorf("sqlite store at %s has no once schema; run 'once migrate --db %s' first", abs, url)
			}
		}
	}
	s, err := openStore(ctx, url)
	if err != nil {
		return nil, err
	}
	d := &database{name: s.Name, store: s}
	cfg.Store = s.Store
	if d.client, err = once.New(cfg); err == nil {
		err = d.checkSchema(ctx, url)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return d, nil
}

// checkSchema refuses a schema older than this build's, one a newer
// once migrated (whose rows this build may misread or write wrongly), and
// one whose record of versions has a gap.
func (d *database) checkSchema(ctx context.Context, url string) error {
	ms, err := d.store.Migrations()
	if err != nil {
		return err
	}
	vs, err := d.store.Versions(ctx)
	switch {
	case err != nil:
		return err
	case len(vs) == 0:
		return fmt.Errorf("%s has no once schema; run 'once migrate --db %s' first", d.name, url)
	}
	if err := storekit.CheckVersions(vs, len(ms)); err != nil {
		return fmt.Errorf("%s: %w", d.name, err)
	}
	if v := vs[len(vs)-1]; v < len(ms) {
		return fmt.Errorf("%s has schema version %d and this once needs %d; run 'once migrate --db %s'", d.name, v, len(ms), url)
	}
	return nil
}
