package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Pooler says what stands between the store's pool and PostgreSQL, so
// that the store relies only on what gets through it. A pooler in
// transaction mode, such as PgBouncer with pool_mode=transaction, lends
// a client a server connection for one transaction at a time: nothing
// a session sets up outlives the transaction that set it up. The store
// keeps no such state itself (every table is qualified by its schema,
// its one advisory lock is transaction-scoped), but pgx, by default,
// prepares its statements by name on the connection and expects to
// find them there next time, and LISTEN belongs to a session.
type Pooler string

const (
	// PoolerNone: the pool reaches PostgreSQL itself, or through a
	// proxy that keeps one server connection per client connection.
	// The zero value. Open and Migrate check it: a pool that prepares
	// statements (pgx's default) and turns out to be pooled is refused,
	// with what to set.
	PoolerNone Pooler = ""
	// PoolerSession: a pooler that gives each client connection one
	// server connection for as long as it lasts (PgBouncer's
	// pool_mode=session). Everything works as it does directly.
	PoolerSession Pooler = "session"
	// PoolerTransaction: a pooler that lends a server connection for
	// one transaction at a time (PgBouncer's pool_mode=transaction).
	// The pool must not prepare named statements: its
	// default_query_exec_mode must be exec, cache_describe or
	// simple_protocol; Open sets exec when the URL names none. LISTEN
	// does not get through: without Config.ListenURL, waiters poll.
	PoolerTransaction Pooler = "transaction"
)

// errStatementMode refuses a pooler in statement mode.
var errStatementMode = errors.New(`postgres: a pooler in statement mode allows no transaction, and the store runs transactions (Migrate, DoTx); ` +
	`set the pooler to transaction mode (PgBouncer's pool_mode=transaction) and the store's pooler to "transaction" (postgres.PoolerTransaction)`)

// ParsePooler reads a pooler mode by name, as in a URL's once_pooler
// parameter: "none" (or empty), "session" or "transaction".
func ParsePooler(s string) (Pooler, error) {
	switch s {
	case "", "none":
		return PoolerNone, nil
	case "session":
		return PoolerSession, nil
	case "transaction":
		return PoolerTransaction, nil
	case "statement":
		return "", errStatementMode
	}
	return "", fmt.Errorf(`postgres: pooler mode %q is not one the store knows; use "none", "session" or "transaction" (PgBouncer's pool_mode)`, s)
}

// checkExecMode refuses a pool whose statements would not survive the
// pooler, or could run another client's statement.
func checkExecMode(mode pgx.QueryExecMode, pooler Pooler) error {
	switch pooler {
	case PoolerNone, PoolerSession, PoolerTransaction:
	case "statement":
		return errStatementMode
	default:
		return fmt.Errorf("postgres: Config.Pooler %q is not a pooler mode the store knows; use postgres.PoolerNone, PoolerSession or PoolerTransaction", string(pooler))
	}
	switch {
	case mode == pgx.QueryExecModeDescribeExec:
		// It parses a statement unnamed in one round trip and binds it
		// in the next: behind a pooler in transaction mode the second
		// may reach a server connection where another client's unnamed
		// statement waits, and run that with this one's arguments. The
		// store cannot always tell that it is pooled, and gains nothing
		// from the mode, so it refuses it everywhere.
		return errors.New("postgres: the pool's default_query_exec_mode is describe_exec, which the store refuses: " +
			"it prepares a statement in one round trip and runs it in the next, so behind a connection pooler in " +
			"transaction mode it can run another client's statement with the store's arguments; " +
			"use default_query_exec_mode=exec (or cache_describe) in the URL, or set pgxpool.Config.ConnConfig.DefaultQueryExecMode")
	case mode == pgx.QueryExecModeCacheStatement && pooler == PoolerTransaction:
		return errors.New("postgres: Config.Pooler is transaction, but the pool's default_query_exec_mode is cache_statement (pgx's default), " +
			"which prepares named statements that a pooler in transaction mode loses between transactions (prepared statement … already exists, 42P05); " +
			"use default_query_exec_mode=exec in the URL, or set pgxpool.Config.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec")
	}
	return nil
}

// namesExecMode reports whether a connection string sets
// default_query_exec_mode, in either of its forms (URL or key=value):
// Open leaves a mode the caller chose to checkExecMode.
func namesExecMode(connString string) bool {
	return strings.Contains(connString, "default_query_exec_mode")
}

// pooledBackend reports whether conn goes through a pooler: PgBouncer
// (and poolers like it) gives each client a cancel key of its own, so
// the process id the connection was given at startup is not that of
// the backend that runs its statements. A plain TCP proxy passes the
// key through. The query uses the simple protocol, which prepares
// nothing, so the check itself works behind any pooler.
func pooledBackend(ctx context.Context, conn *pgx.Conn) (pooled bool, backend, given uint32, err error) {
	given = conn.PgConn().PID()
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&backend); err != nil {
		return false, 0, given, err
	}
	return backend != given, backend, given, nil
}

// checkPooled refuses a pool that prepares statements when conn shows
// it to be pooled and the pooler was not named: in transaction mode its
// statements would fail, at random, under load.
func (s *Store) checkPooled(ctx context.Context, conn *pgx.Conn) error {
	if s.pooler != PoolerNone || s.execMode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	pooled, backend, given, err := pooledBackend(ctx, conn)
	if err != nil {
		return s.wrap(err)
	}
	if !pooled {
		return nil
	}
	return fmt.Errorf("%s: the connection goes through a connection pooler (PostgreSQL runs its statements in process %d, not %d as the connection was told), "+
		"and the pool prepares named statements (default_query_exec_mode cache_statement, pgx's default), which a pooler in transaction mode loses between transactions; "+
		"say which mode it pools in: Config.Pooler = postgres.PoolerTransaction (once_pooler=transaction in the once command's URL) "+
		"for PgBouncer's pool_mode=transaction, or PoolerSession for pool_mode=session; or set default_query_exec_mode=exec in the URL", s, backend, given)
}

// preparedStatementLost reports an error of a named prepared statement
// that the connection expected and the server did not have, or had
// already: what a pooler in transaction mode does to pgx's statement
// cache. It is no refusal of the data.
func preparedStatementLost(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == pgerrcode.DuplicatePreparedStatement || pe.Code == pgerrcode.InvalidSQLStatementName)
}

// pollNote says, once per store, why its waiters poll when the pooler
// keeps them from listening.
func (s *Store) pollNote() {
	if s.pollWhy == nil {
		return
	}
	s.pollWhy.Do(func() {
		s.log.Info("postgres store: waiters poll their row (every 250ms to 1s) instead of listening for notifications: "+
			"Config.Pooler is transaction, where LISTEN does not get through; set Config.ListenURL to PostgreSQL's own address to wake them at once",
			"store", s.String())
	})
}
