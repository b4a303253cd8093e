// Package postgres is the PostgreSQL store for once, on pgx v5. It is the
// store for many workers on many machines: every claim is one insert on a
// primary key that the database arbitrates.
//
// # Waiting for an attempt in flight
//
// A Do made with once.WaitFor that meets another attempt's claim is woken
// by a notification when that attempt ends. The waiter marks the row
// (its waiters column), and every transition of a marked row, and the
// purge of one, runs pg_notify on the channel once_actions, in the same
// statement, so the notification is delivered when the change commits
// and never for one that rolls back. Its payload is the action table,
// schema-qualified, a colon and the key: "public.once_action:3f…".
// Rows nobody waits for notify nothing: PostgreSQL serializes the
// commits of notifying transactions on one lock, which would otherwise
// slow every outcome down.
//
// The store listens on one connection of its own, opened with the
// pool's connection settings (or Config.ListenURL) on the first wait,
// shared by all the store's waiters, reopened with backoff when it
// drops, and closed by Close; never a connection of the pool. When it
// opens, it notifies itself through the pool and expects the
// notification back within a second; if it does not come (a pooler in
// transaction mode, such as PgBouncer, loses them), the store stops
// marking rows and tries again a minute later. Waiters poll their row
// all along (every 250ms, backing off to every second), so a lost
// notification only delays them. Config.PollOnly turns listening off.
//
// # Group commit
//
// Claims and outcomes that arrive while others are being written are
// sent together: one transaction, one round trip and one commit for a
// batch of them, each answered as its own statement would have been
// (Config.MaxBatch, Config.BatchesInFlight). A lone call is sent at
// once, as its own statement; Config.Unbatched sends every call so.
// A batch whose reply is lost gives each of its callers the error of a
// lost reply, and the engine reads each write back by its token, as it
// does for a statement of its own. Store.ClaimMany and
// Store.TransitionMany send many at once.
//
// # Behind a connection pooler
//
// Through a pooler in transaction mode (PgBouncer's
// pool_mode=transaction) set Config.Pooler to PoolerTransaction. The
// store keeps no state in a session: its tables are qualified by their
// schema, not found on a search_path; its one advisory lock, Migrate's,
// is transaction-scoped; it sets nothing with SET (a batch's
// lock_timeout is set for its transaction only). What it needs is a
// pool that prepares no named statements, which such a pooler loses
// between transactions: default_query_exec_mode exec, cache_describe or
// simple_protocol. Open sets exec when the URL names no mode; New
// refuses cache_statement, pgx's default. The store refuses
// describe_exec everywhere: it parses a statement in one round trip
// and runs it in the next, which behind such a pooler can run another
// client's statement with the store's arguments. Waiters poll, as
// LISTEN does not get through, unless Config.ListenURL reaches
// PostgreSQL directly. Open and Migrate notice a pooler that was not
// named (its connections' process ids are its own, not PostgreSQL's)
// and refuse a pool that prepares statements, naming what to set. A
// DoTx transaction holds one server connection from its first
// statement to its end, as it does directly. Statement mode, which
// allows no transaction, is not supported.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/storekit"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Config names where the store keeps its tables.
type Config struct {
	// Schema holds the tables. Empty means "public". Migrate creates it if
	// it does not exist. PostgreSQL's own schemas (information_schema,
	// pg_catalog and other pg_ names) are refused.
	Schema string
	// Prefix starts every table and index name. Empty means "once_".
	Prefix string
	// ListenURL is where the store opens the one connection it listens
	// on for notifications (postgres://user@host:5432/dbname), when the
	// pool's own connection settings do not reach PostgreSQL directly:
	// behind a pooler in transaction mode (PgBouncer's
	// pool_mode=transaction), LISTEN does not work, so point it at the
	// server itself. Empty means the pool's settings.
	ListenURL string
	// PollOnly turns listening off: a waiting Do learns that the other
	// attempt ended by polling its row alone, every 250ms to 1s, and no
	// connection beyond the pool's is opened. For deployments that
	// reach PostgreSQL only through a transaction-mode pooler; the
	// store would find out by itself that notifications are lost there,
	// but not before it tried. It cannot be set with ListenURL.
	PollOnly bool
	// Pooler says what stands between the pool and PostgreSQL; see
	// Pooler. Zero means nothing that shares server connections
	// between clients, which Open and Migrate check. Set
	// PoolerTransaction behind PgBouncer's pool_mode=transaction: the
	// pool then must not use pgx's default statement cache, and
	// without ListenURL waiters poll.
	Pooler Pooler
	// Logger gets the store's notices: one line, the first time a
	// waiter polls because Pooler keeps it from listening. Nil means
	// slog.Default().
	Logger *slog.Logger
	// Unbatched turns group commit off: each Claim and Transition is a
	// statement of its own, with a round trip and a commit of its own.
	// By default (false) the claims and outcomes that queue up while
	// others are being written are sent together, a batch to a
	// transaction (see group.go's comment and ClaimMany), which many
	// concurrent workers need to get past the server's commit rate; a
	// lone caller is sent at once either way.
	Unbatched bool
	// MaxBatch caps the requests one batch carries. Zero means 128.
	MaxBatch int
	// BatchesInFlight caps the batches sent at once, each on a
	// connection of the pool. One is sent as soon as a request finds
	// none in flight; another starts beside it only when 16 requests
	// wait, and fewer wait for it to end, to go together in the next.
	// Zero means 4. A store sends at most half its pool's connections'
	// worth, so that other statements (heartbeats, reads, recovery)
	// find connections. A batch that carries a request whose context
	// has no deadline is not counted: it may wait on a hung connection
	// for as long as that caller does, forever, and is sent beside
	// them, as its statements would have been without batching.
	BatchesInFlight int
}

// dbtx is what a pool and a transaction have in common.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is a once.Store on PostgreSQL.
type Store struct {
	db   dbtx
	pool *pgxpool.Pool
	// conns runs statements on the pool (poolDB); db is conns, or a
	// caller's transaction (BindTx).
	conns  poolDB
	owned  bool
	inTx   bool
	addr   string
	names  storekit.Names
	q      queries
	schema string
	// listen is the store's listening connection, shared with the stores
	// BindTx makes; nil with Config.PollOnly.
	listen *listener
	// pollMin and pollMax space a waiter's reads of its row.
	pollMin, pollMax time.Duration
	// closed is closed by Close when the store owns its pool (Open): its
	// waiters can read nothing more. Nil for a pool passed to New, which
	// stays usable after Close.
	closed    chan struct{}
	closeOnce *sync.Once
	// pooler and execMode are the configured pooler and the pool's
	// default_query_exec_mode, for the pooled-connection check.
	pooler   Pooler
	execMode pgx.QueryExecMode
	log      *slog.Logger
	// pollWhy, when not nil, says once that the pooler keeps waiters
	// from listening; shared with the stores BindTx makes.
	pollWhy *sync.Once
	// batch queues claims and outcomes for group commit; nil with
	// Config.Unbatched.
	batch *batcher
	// counts is the last count of the finished actions (stats.go).
	counts *storekit.Counts
}

var (
	_ once.Store            = (*Store)(nil)
	_ once.TxBinder[pgx.Tx] = (*Store)(nil)
	_ once.Waiter           = (*Store)(nil)
	_ once.Migrator         = (*Store)(nil)
)

// notifyChannel is the channel the store's statements notify on.
const notifyChannel = "once_actions"

// Poll intervals for a waiter's reads of its row: the fallback for a
// notification that was lost, and the only way without one.
const (
	pollMin = 250 * time.Millisecond
	pollMax = time.Second
)

// names fills in cfg's defaults and checks it.
func (cfg Config) names() (Config, storekit.Names, error) {
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "once_"
	}
	switch {
	case cfg.MaxBatch < 0:
		return cfg, storekit.Names{}, fmt.Errorf("postgres: Config.MaxBatch is %d; it must be positive, or zero for %d", cfg.MaxBatch, defaultMaxBatch)
	case cfg.BatchesInFlight < 0:
		return cfg, storekit.Names{}, fmt.Errorf("postgres: Config.BatchesInFlight is %d; it must be positive, or zero for %d", cfg.BatchesInFlight, defaultBatchesInFlight)
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = defaultMaxBatch
	}
	if cfg.BatchesInFlight == 0 {
		cfg.BatchesInFlight = defaultBatchesInFlight
	}
	if err := storekit.CheckSchema("postgres: Config.Schema", cfg.Schema, false); err != nil {
		return cfg, storekit.Names{}, err
	}
	if err := storekit.CheckIdent("postgres: Config.Prefix", cfg.Prefix, false); err != nil {
		return cfg, storekit.Names{}, err
	}
	return cfg, storekit.Names{Schema: cfg.Schema, Prefix: cfg.Prefix, Quote: quoteIdent}, nil
}

// Migrations returns the schema migrations rendered for cfg's schema and
// prefix, without a database: what a store's Migrations returns, for
// users who run their own migration tool.
func Migrations(cfg Config) ([]once.Migration, error) {
	_, names, err := cfg.names()
	if err != nil {
		return nil, err
	}
	return storekit.LoadMigrations(migrationFS, "migrations", names)
}

// New returns a store over an existing pool. It does no I/O. The first
// Do that waits (once.WaitFor) opens the store's listening connection;
// Close closes it, and leaves the pool to its owner. It refuses a pool
// whose default_query_exec_mode would not survive cfg.Pooler (see
// Pooler), and describe_exec everywhere.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres: New needs a *pgxpool.Pool; use Open to make one from a URL")
	}
	cfg, names, err := cfg.names()
	if err != nil {
		return nil, err
	}
	cc := pool.Config().ConnConfig
	if err := checkExecMode(cc.DefaultQueryExecMode, cfg.Pooler); err != nil {
		return nil, err
	}
	listenCfg := cc
	switch {
	case cfg.PollOnly && cfg.ListenURL != "":
		return nil, errors.New("postgres: Config.ListenURL is set but Config.PollOnly turns listening off; set one of them")
	case cfg.ListenURL != "":
		listenCfg, err = pgx.ParseConfig(cfg.ListenURL)
		if err != nil {
			return nil, fmt.Errorf("postgres: Config.ListenURL is not valid (%v); expected postgres://user@host:5432/dbname", redact(err))
		}
	}
	tag := cfg.Schema + "." + cfg.Prefix + "action"
	conns := poolDB{pool: pool, closing: newClosing(int(pool.Config().MaxConns))}
	s := &Store{
		db:      conns,
		conns:   conns,
		pool:    pool,
		addr:    net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))),
		names:   names,
		q:       buildQueries(names.Table("action"), names.Table("event"), tag),
		schema:  cfg.Schema,
		pollMin: pollMin,
		pollMax: pollMax,
	}
	s.pooler, s.execMode, s.log = cfg.Pooler, cc.DefaultQueryExecMode, cfg.Logger
	if s.log == nil {
		s.log = slog.Default()
	}
	s.counts = newCounts(s)
	if !cfg.Unbatched {
		// Half the pool at most, so that heartbeats, reads and recovery
		// never wait behind batches for a connection.
		runners := min(cfg.BatchesInFlight, max(1, int(pool.Config().MaxConns)/2))
		s.batch = &batcher{s: s, maxBatch: cfg.MaxBatch, runners: runners}
	}
	// LISTEN through a pooler in transaction mode would hold no session
	// to listen on.
	pooledPoll := cfg.Pooler == PoolerTransaction && cfg.ListenURL == "" && !cfg.PollOnly
	if pooledPoll {
		s.pollWhy = new(sync.Once)
	}
	if !cfg.PollOnly && !pooledPoll {
		s.listen = newListener(listenCfg, tag, func(ctx context.Context, payload string) error {
			_, err := pool.Exec(ctx, `SELECT pg_notify($1, $2)`, notifyChannel, payload)
			return err
		})
	}
	return s, nil
}

// Open connects to the database at url (postgres://user@host:port/db)
// and returns a store that owns its pool; Close closes it. It checks the
// connection, so an unreachable server is reported here, by address,
// and refuses a pool that prepares statements through a pooler that
// cfg.Pooler does not name. With cfg.Pooler PoolerTransaction and no
// default_query_exec_mode in url, the pool uses exec. Unless url names
// pool_max_conns, the pool holds two connections for each batch in
// flight plus four for each core (poolSize).
func Open(ctx context.Context, url string, cfg Config) (*Store, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres store: the URL is not valid (%v); expected postgres://user@host:5432/dbname", redact(err))
	}
	if cfg.Pooler == PoolerTransaction && !namesExecMode(url) {
		// Statements that prepare nothing on the server, sent whole in
		// one round trip.
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	if !strings.Contains(url, "pool_max_conns") {
		pc.MaxConns = max(pc.MaxConns, poolSize(cfg))
	}
	addr := net.JoinHostPort(pc.ConnConfig.Host, strconv.Itoa(int(pc.ConnConfig.Port)))
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres store at %s: %w", addr, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres store at %s: cannot connect (%w); is PostgreSQL running and the URL right?", addr, err)
	}
	s, err := New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if err := pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { return s.checkPooled(ctx, c.Conn()) }); err != nil {
		s.Close()
		pool.Close()
		return nil, err
	}
	s.owned = true
	s.closed, s.closeOnce = make(chan struct{}), new(sync.Once)
	return s, nil
}

// poolSize is the pool Open makes when the URL names none: a connection
// for each batch in flight, as many again for the statements beside them
// (heartbeats, read-backs, recovery, waiters' reads), and four for each
// core, for effects that query the same pool. pgx's default, max(4,
// cores), is what group commit alone would fill on a small machine.
// Without group commit every running Do may hold a connection; name
// pool_max_conns in the URL for more (the README says how to size it).
func poolSize(cfg Config) int32 {
	batches := cfg.BatchesInFlight
	if batches == 0 {
		batches = defaultBatchesInFlight
	}
	return int32(2*batches + 4*runtime.NumCPU())
}

// redact keeps a password in a URL out of an error message.
func redact(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "://"); i >= 0 {
		if j := strings.Index(msg[i:], "@"); j >= 0 {
			return msg[:i+3] + "…" + msg[i+j:]
		}
	}
	return msg
}

// Close closes the store's listening connection, and the pool if Open
// made it; a pool passed to New is the caller's to close. Waiters of a
// store that closes its pool stop waiting and answer at once; those of
// a store over a pool passed to New go on polling through it. On a
// store bound to a transaction it does nothing: the store it was bound
// from owns them.
func (s *Store) Close() error {
	if s.inTx {
		return nil
	}
	if s.listen != nil {
		s.listen.close()
	}
	s.counts.Close()
	if s.owned {
		// Waiters first: a read of the closed pool tells them nothing.
		s.closeOnce.Do(func() { close(s.closed) })
		s.pool.Close()
		// Connections taken out of the pool as pgx closed them
		// (poolDB) end as the pool's own do in pool.Close: at once,
		// or within pgx's 15 s when the server cannot be reached to
		// be asked to cancel. A pool passed to New is the caller's to
		// close.
		s.conns.closing.wait()
	}
	return nil
}

// Pool returns the store's pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// String names the store and its address, for messages.
func (s *Store) String() string { return "postgres store at " + s.addr }

// BindTx returns a store whose statements run in tx. once.DoTx calls it.
func (s *Store) BindTx(tx pgx.Tx) once.Store {
	c := *s
	c.db, c.inTx = tx, true
	return &c
}

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

func (s *Store) wrap(err error) error {
	if err == nil {
		return nil
	}
	if rejected(err) {
		return fmt.Errorf("%s: %w: %w", s, once.ErrRejected, err)
	}
	if preparedStatementLost(err) {
		return fmt.Errorf("%s: %w; a connection pooler in transaction mode loses prepared statements: "+
			"set default_query_exec_mode=exec in the URL and Config.Pooler = postgres.PoolerTransaction", s, err)
	}
	return fmt.Errorf("%s: %w", s, err)
}

// rejected reports an error about the data itself, by PostgreSQL's own
// classes: a data exception (22: invalid text, a bad value), an
// integrity violation (23), or a syntax or access rule violation (42).
// Sending the same again gets the same answer. A prepared statement a
// pooler lost (42P05) is in class 42 but says nothing of the data.
func rejected(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || preparedStatementLost(err) {
		return false
	}
	return pgerrcode.IsDataException(pe.Code) || pgerrcode.IsIntegrityConstraintViolation(pe.Code) ||
		pgerrcode.IsSyntaxErrororAccessRuleViolation(pe.Code)
}

const columns = `key, fingerprint, run_id, step, kind, target, payload, status, attempt, result, error, lease_until, created_at, claimed_at, updated_at, completed_at, verify_failures, resolved_by, resolved_at, resolve_note, token, recovery, retention_us, retain_until, redrive_after_us, redrive`

const eventColumns = `id, key, at, type, attempt, from_status, to_status, actor, note, origin`

type queries struct {
	claim, reclaim, selectRow, heartbeat, transition, get, list        string
	recoverable, recoverKey, appendEvent, events, recent, stats, purge string
	purgeCount, state, await, eventsRow                                string
	openStats, finishedStats, estimate                                 string
	outcome, lockOutcome, purgeOlder, purgeCountOlder                  string
	// claims and transitions are claim and transition for many keys at
	// once, in one statement each (batch.go).
	claims, transitions string
	// claimInTx is the claim statement inside a caller's transaction.
	claimInTx string
	// trailInfo, eventsAfter and eventsBefore read a page of a trail
	// (EventPage); listBrief and count head a brief list and a count.
	trailInfo, eventsAfter, eventsBefore, listBrief, count string
}

// The purge's statements; $DUE is which finished actions are due: past
// their deadline (purgeDue, read from action_retain, with the unused $1
// a one-time filter), or not updated for $1 (purgeOlder).
const (
	purgeStmt = `
WITH gone AS (
    DELETE FROM $T WHERE key IN (
        SELECT key FROM $T
        WHERE status IN ('succeeded', 'failed') AND $DUE
        LIMIT $2
        FOR UPDATE SKIP LOCKED)
    RETURNING key, waiters
), ev AS (
    DELETE FROM $E WHERE key IN (SELECT key FROM gone)
), n AS (
    SELECT $NOTIFY FROM gone WHERE waiters
)
SELECT count(*), (SELECT count(*) FROM n) FROM gone`
	purgeCountStmt = `SELECT count(*) FROM $T WHERE status IN ('succeeded', 'failed') AND $DUE`
	purgeDue       = `retain_until <= now() AND $1::bigint <= 0`
	purgeOlder     = `updated_at < now() - $1::float8 * interval '1 microsecond'`
)

// buildQueries renders the statements for the tables; tag names the
// action table in notification payloads. Schema and prefix are plain
// identifiers (CheckIdent), so the tag is safe in a literal.
func buildQueries(table, events, tag string) queries {
	notify := `pg_notify('` + notifyChannel + `', '` + tag + `:' || key)`
	// The process that claimed action a: its origin column, or, for a
	// row claimed before the column was (migration 008), the origin of
	// its written claim.
	origin := `CASE WHEN a.origin <> '' THEN a.origin ELSE coalesce((SELECT c.origin FROM ` + events +
		` c WHERE c.key = a.key AND c.attempt = 1 AND c.type = 'claimed' ORDER BY c.id LIMIT 1), '') END`
	// $S is the status as an expression no queue's partial index is
	// defined over: a statement that names its key then reads the
	// primary key, whatever the statistics make a queue's index look
	// like (TestOneKeyStatementsReadThePrimaryKey).
	r := strings.NewReplacer("$T", table, "$E", events, "$C", columns, "$V", eventColumns, "$NOTIFY", notify, "$ORIGIN", origin, "$S", "(status || '')",
		"$QC", qualified("c", columns), "$QT", qualified("t", columns))
	return queries{
		// The claim statement for many keys, one each (batch.go), as
		// the claim statement does it for one: standing rows read
		// first, by their primary key, and only the other keys inserted,
		// in the order of their keys; each row comes back with its
		// request's index, i. A key whose standing row was committed
		// after the statement's snapshot comes back not at all, and is
		// read again, as after the claim statement alone.
		//
		// Every read of the action table names its keys (key =
		// ANY($1), here and in transitions), and a batch runs with
		// sequential scans off (batchSettingsSQL): whatever plan
		// PostgreSQL made and kept, also one made while the log was
		// small, a batch reads its keys' rows through the primary key,
		// and never the whole log (TestGroupCommitReadsByKeyAsTheLogGrows).
		claims: r.Replace(`
WITH b AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bytea[], $8::bigint[],
        $9::text[], $10::text[], $11::bigint[], $12::bigint[], $13::boolean[], $14::text[])
        WITH ORDINALITY AS b(key, fingerprint, run_id, step, kind, target, payload, lease_us, token, recovery, retention_us,
            redrive_after_us, redrive, origin, i)
), standing AS (
    SELECT $QT, b.i FROM b JOIN $T t ON t.key = b.key AND t.key = ANY($1::text[])
), claimed AS (
    INSERT INTO $T (key, fingerprint, run_id, step, kind, target, payload, status, attempt, lease_until, token, recovery, retention_us,
        redrive_after_us, redrive, origin)
    SELECT key, fingerprint, run_id, step, kind, target, payload, 'in_flight', 1, statement_timestamp() + lease_us::float8 * interval '1 microsecond',
        token, recovery, retention_us, redrive_after_us, redrive, origin
    FROM b WHERE NOT EXISTS (SELECT 1 FROM standing s WHERE s.i = b.i) ORDER BY i
    ON CONFLICT (key) DO NOTHING
    RETURNING $C
)
SELECT $C, false, statement_timestamp(), i FROM standing
UNION ALL
SELECT $QC, true, statement_timestamp(), b.i FROM claimed c JOIN b ON b.key = c.key`),
		// The transition statement for many keys, one each: every
		// request's compare-and-set, event and notification as the
		// statement alone makes them. $11 holds each request's From
		// statuses joined by commas. It returns the index, i, of each
		// request that applied.
		transitions: r.Replace(`
WITH b AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::boolean[], $7::bigint[], $8::bigint[],
        $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $19::text[],
        $20::boolean[])
        WITH ORDINALITY AS b(key, attempt, to_status, result, error, new_attempt, lease_us, verify_failures,
            resolved_by, resolve_note, from_statuses, hold, ev_type, ev_from, actor, note, token, origin, waiting, i)
), u AS (
    UPDATE $T t SET status = b.to_status, result = b.result::json, error = b.error, updated_at = now(),
        attempt = t.attempt + CASE WHEN b.new_attempt THEN 1 ELSE 0 END,
        claimed_at = CASE WHEN b.new_attempt THEN now() ELSE t.claimed_at END,
        lease_until = CASE WHEN b.lease_us > 0 THEN now() + b.lease_us::float8 * interval '1 microsecond' END,
        completed_at = CASE WHEN b.to_status IN ('succeeded', 'failed') THEN now() END,
        retain_until = CASE WHEN b.to_status IN ('succeeded', 'failed')
            THEN now() + coalesce(t.retention_us, $18::bigint)::float8 * interval '1 microsecond' END,
        verify_failures = b.verify_failures,
        resolved_by = CASE WHEN b.resolved_by <> '' THEN b.resolved_by ELSE t.resolved_by END,
        resolved_at = CASE WHEN b.resolved_by <> '' THEN now() ELSE t.resolved_at END,
        resolve_note = CASE WHEN b.resolved_by <> '' THEN b.resolve_note ELSE t.resolve_note END,
        hold_token = NULL,
        token = CASE WHEN b.token <> '' THEN b.token ELSE t.token END
    FROM b
    WHERE t.key = b.key AND t.key = ANY($1::text[]) AND t.attempt = b.attempt AND t.status = ANY(string_to_array(b.from_statuses, ','))
      AND (b.hold = '' OR t.hold_token = b.hold)
      AND (NOT b.waiting OR t.updated_at < now() - coalesce(t.redrive_after_us, $21::bigint)::float8 * interval '1 microsecond')
    RETURNING b.i, t.key, t.attempt, t.status, t.waiters
), ev AS (
    INSERT INTO $E (key, type, attempt, from_status, to_status, actor, note, origin)
    SELECT u.key, b.ev_type, u.attempt, b.ev_from, u.status, b.actor, b.note, b.origin FROM u JOIN b ON b.i = u.i WHERE b.ev_type <> ''
), n AS (
    SELECT $NOTIFY FROM u WHERE waiters
)
SELECT i, (SELECT count(*) FROM n) FROM u`),
		// One statement claims a new key; when the key is held it returns
		// the standing row instead, so a duplicate costs one round trip.
		// The standing row is read first, by its primary key, and a
		// duplicate goes no further: the insert has nothing to insert,
		// so a replay is one indexed read, with no speculative insertion,
		// no lock and nothing written (the insert's values are cast, as
		// the SELECT that carries them types nothing from the table). A
		// row committed after the statement's snapshot was taken is not
		// standing for it, and its insert meets the conflict: no row
		// comes back, and claimRest reads it again with a fresh snapshot
		// (TestClaimSeesARowCommittedAfterItsSnapshot).
		// A first claim writes no event: the row, with its origin, is
		// the trail's first entry (storekit.WithHappyPath).
		claim: r.Replace(`
WITH standing AS (
    SELECT $C FROM $T WHERE key = $1
), claimed AS (
    INSERT INTO $T (key, fingerprint, run_id, step, kind, target, payload, status, attempt, lease_until, token, recovery, retention_us,
        redrive_after_us, redrive, origin)
    SELECT $1::text, $2::text, $3::text, $4::bigint, $5::text, $6::text, $7::bytea, 'in_flight', 1,
        statement_timestamp() + $8::float8 * interval '1 microsecond', $9::text, $10::text, $11::bigint, $12::bigint, $13::boolean, $14::text
    WHERE NOT EXISTS (SELECT 1 FROM standing)
    ON CONFLICT (key) DO NOTHING
    RETURNING $C
)
SELECT $C, false, statement_timestamp() FROM standing
UNION ALL
SELECT $C, true, statement_timestamp() FROM claimed`),
		// Inside a caller's transaction (BindTx) the snapshot may be
		// older than the statement: in REPEATABLE READ or SERIALIZABLE
		// it is the transaction's first statement's. A standing row
		// read from it may have moved on since (in flight then,
		// succeeded now), and must not be answered as it stood. There
		// the insert goes first: it meets the newest row, and a row
		// that changed after the snapshot is a serialization failure,
		// which the caller retries (TestClaimInAnOlderSnapshot).
		// The time it reports, against which the standing row's lease
		// is read, and from which its own lease runs, is the
		// statement's, as in claim: in a transaction now() is when the
		// transaction began, and a lease that ran out since would look
		// live.
		claimInTx: r.Replace(`
WITH claimed AS (
    INSERT INTO $T (key, fingerprint, run_id, step, kind, target, payload, status, attempt, lease_until, token, recovery, retention_us,
        redrive_after_us, redrive, origin)
    VALUES ($1, $2, $3, $4, $5, $6, $7, 'in_flight', 1, statement_timestamp() + $8::float8 * interval '1 microsecond', $9, $10, $11, $12, $13, $14)
    ON CONFLICT (key) DO NOTHING
    RETURNING $C
)
SELECT $C, true, statement_timestamp() FROM claimed
UNION ALL
SELECT $C, false, statement_timestamp() FROM $T WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM claimed)`),
		// A released action is claimed again as the next attempt, if the
		// payload is the same.
		reclaim: r.Replace(`
WITH claimed AS (
    UPDATE $T SET status = 'in_flight', attempt = attempt + 1, lease_until = statement_timestamp() + $3::float8 * interval '1 microsecond',
        claimed_at = now(), updated_at = now(), completed_at = NULL, result = NULL, error = '', verify_failures = 0,
        hold_token = NULL, token = $4, recovery = $5, retention_us = $6, retain_until = NULL,
        redrive_after_us = $7, redrive = $8, waiters = false
    WHERE key = $1 AND $S = 'released' AND fingerprint = $2
    RETURNING $C
), ev AS (
    INSERT INTO $E (key, type, attempt, from_status, to_status, actor, origin)
    SELECT key, 'claimed', attempt, 'released', 'in_flight', 'worker', $9 FROM claimed
)
SELECT $C, true, statement_timestamp() FROM claimed`),
		// The fallback when the row a claim conflicted with was committed
		// after the claim's snapshot was taken.
		selectRow: r.Replace(`SELECT $C, false, statement_timestamp() FROM $T WHERE key = $1`),
		heartbeat: r.Replace(`
UPDATE $T SET lease_until = now() + $3::float8 * interval '1 microsecond', hold_token = NULL
WHERE key = $1 AND attempt = $2 AND $S = 'in_flight'
RETURNING lease_until`),
		// A fenced compare-and-set and its event, in one statement, and a
		// notification when someone waits for the row. A CTE that calls
		// a volatile function runs only when read: the final SELECT
		// reads it.
		transition: r.Replace(`
WITH u AS (
    UPDATE $T SET status = $3, result = $4, error = $5, updated_at = now(),
        attempt = attempt + CASE WHEN $6 THEN 1 ELSE 0 END,
        claimed_at = CASE WHEN $6 THEN now() ELSE claimed_at END,
        lease_until = CASE WHEN $7::bigint > 0 THEN now() + $7::float8 * interval '1 microsecond' END,
        completed_at = CASE WHEN $3 IN ('succeeded', 'failed') THEN now() END,
        retain_until = CASE WHEN $3 IN ('succeeded', 'failed')
            THEN now() + coalesce(retention_us, $18::bigint)::float8 * interval '1 microsecond' END,
        verify_failures = $8,
        resolved_by = CASE WHEN $9 <> '' THEN $9 ELSE resolved_by END,
        resolved_at = CASE WHEN $9 <> '' THEN now() ELSE resolved_at END,
        resolve_note = CASE WHEN $9 <> '' THEN $10 ELSE resolve_note END,
        hold_token = NULL,
        token = CASE WHEN $17 <> '' THEN $17 ELSE token END
    WHERE key = $1 AND attempt = $2 AND $S = ANY($11) AND ($12 = '' OR hold_token = $12)
      AND (NOT $20::boolean OR updated_at < now() - coalesce(redrive_after_us, $21::bigint)::float8 * interval '1 microsecond')
    RETURNING key, attempt, status, waiters
), ev AS (
    INSERT INTO $E (key, type, attempt, from_status, to_status, actor, note, origin)
    SELECT key, $13, attempt, $14, status, $15, $16, $19 FROM u WHERE $13 <> ''
), n AS (
    SELECT $NOTIFY FROM u WHERE waiters
)
SELECT count(*), (SELECT count(*) FROM n) FROM u`),
		// Takes a batch of due actions and holds them; SKIP LOCKED keeps
		// concurrent reapers on disjoint batches. $8 maps kinds to their
		// holds in microseconds (RecoverRequest.KindHolds); $2 holds the
		// others. $9 are the recoveries only the kinds $5, or all but $7
		// when $6, may take (once.Verifiable).
		recoverable: r.Replace(`
WITH due AS (
    SELECT key FROM $T
    WHERE status IN ('in_flight', 'unknown') AND lease_until <= now()
      AND ($4::timestamptz IS NULL OR lease_until <= $4)
      AND (NOT (recovery = ANY($9)) OR kind = ANY($5) OR ($6 AND NOT (kind = ANY($7))))
    ORDER BY lease_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE $T SET lease_until = now() + coalesce(($8::jsonb ->> kind)::float8, $2::float8) * interval '1 microsecond', hold_token = $3
WHERE key IN (SELECT key FROM due)
RETURNING $C, now()`),
		// One key, for inline recovery: found by its primary key, so no
		// cached plan scans the due actions to find it. The UPDATE's own
		// row lock and re-check keep two recoverers from both taking it.
		recoverKey: r.Replace(`
UPDATE $T SET lease_until = now() + coalesce(($7::jsonb ->> kind)::float8, $2::float8) * interval '1 microsecond', hold_token = $3
WHERE key = $1 AND $S IN ('in_flight', 'unknown') AND lease_until <= now()
  AND (NOT (recovery = ANY($8)) OR kind = ANY($4) OR ($5 AND NOT (kind = ANY($6))))
RETURNING $C, now()`),
		appendEvent: r.Replace(`INSERT INTO $E (key, type, attempt, from_status, to_status, actor, note, origin) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`),
		events:      r.Replace(`SELECT $V FROM $E WHERE key = $1 ORDER BY id`),
		// What a page of a trail needs of the rest of it
		// (storekit.TrailInfo): $2 is the row's status, $3 its
		// completed_at. It reads the key's events through their index,
		// and keeps none of them.
		trailInfo: r.Replace(`
SELECT count(*), coalesce(bool_or(attempt = 1 AND type = 'claimed'), false),
    coalesce((SELECT origin FROM $E c WHERE c.key = $1 AND c.attempt = 1 AND c.type = 'claimed' ORDER BY c.id LIMIT 1), ''),
    coalesce(bool_or(attempt = 1 AND type <> 'refused' AND to_status = $2::text), false),
    coalesce(min(id) FILTER (WHERE at > $3::timestamptz), 0)
FROM $E WHERE key = $1`),
		eventsAfter:  r.Replace(`SELECT $V FROM $E WHERE key = $1 AND id > $2 ORDER BY id LIMIT $3`),
		eventsBefore: r.Replace(`SELECT $V FROM $E WHERE key = $1 AND id < $2 ORDER BY id DESC LIMIT $3`),
		listBrief:    `SELECT ` + storekit.BriefColumns(columns, "NULL::bytea", "NULL::json") + ` FROM ` + table,
		count:        `SELECT count(*) FROM ` + table,
		eventsRow:    r.Replace(`SELECT $C, origin FROM $T WHERE key = $1`),
		// The worker's outcome of attempt 1, which the row describes and
		// the trail does not hold (storekit.WithHappyPath), written out
		// before a decision changes the row; nothing when the trail holds
		// an event that took the row where it stands.
		lockOutcome: r.Replace(`
SELECT 1 FROM $T WHERE key = $1 AND attempt = 1 AND status IN ('succeeded', 'failed') FOR NO KEY UPDATE`),
		outcome: r.Replace(`
INSERT INTO $E (key, at, type, attempt, from_status, to_status, actor, note, origin)
SELECT key, completed_at, status, 1, 'in_flight', status, 'worker', '', $ORIGIN FROM $T a
WHERE key = $1 AND attempt = 1 AND status IN ('succeeded', 'failed') AND completed_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM $E e WHERE e.key = a.key AND e.attempt = 1 AND e.type <> 'refused' AND e.to_status = a.status)`),
		// The trail's events of the given types, newest first, with the
		// happy path's that were not written (storekit.WithHappyPath) made
		// from the action rows: a first claim for a row whose trail does
		// not hold one, the worker's outcome of attempt 1 for a row that
		// stands there with no event that took it there. Asked only for
		// recoveries (the console), the derived branches are one-time
		// filtered away and read no row. Events at the same time (a
		// claim and its success in one transaction, DoTx) keep the
		// order they would have had written: the claim first, the
		// outcome after what was written, as in WithHappyPath.
		recent: r.Replace(`
SELECT $V FROM (
    SELECT $V, 1 AS ord FROM $E WHERE cardinality($1::text[]) = 0 OR type = ANY($1)
    UNION ALL
    SELECT 0, key, created_at, 'claimed', 1, '', 'in_flight', 'worker', '', origin, 0 FROM $T a
    WHERE (cardinality($1::text[]) = 0 OR 'claimed' = ANY($1))
      AND NOT EXISTS (SELECT 1 FROM $E e WHERE e.key = a.key AND e.attempt = 1 AND e.type = 'claimed')
    UNION ALL
    SELECT 0, key, completed_at, status, 1, 'in_flight', status, 'worker', '', $ORIGIN, 2 FROM $T a
    WHERE (cardinality($1::text[]) = 0 OR 'succeeded' = ANY($1) OR 'failed' = ANY($1))
      AND attempt = 1 AND status IN ('succeeded', 'failed') AND (cardinality($1::text[]) = 0 OR status = ANY($1))
      AND NOT EXISTS (SELECT 1 FROM $E e WHERE e.key = a.key AND e.attempt = 1 AND e.type <> 'refused' AND e.to_status = a.status)
) t ORDER BY at DESC, ord DESC, id DESC LIMIT $2`),
		// Ordered by bytes, as Stats orders the two parts of a large
		// log's count, whatever the columns' collation.
		stats: r.Replace(`SELECT kind, status, recovery, count(*) FROM $T GROUP BY kind, status, recovery
ORDER BY kind COLLATE "C", status COLLATE "C", recovery COLLATE "C"`),
		// The open statuses' counts, each branch read through the
		// partial index whose condition it implies (action_active,
		// action_open), and the finished ones', which read the log
		// (stats.go).
		openStats: r.Replace(`
SELECT kind, status, recovery, count(*) FROM (
    SELECT kind, status, recovery FROM $T WHERE status IN ('in_flight', 'unknown')
    UNION ALL
    SELECT kind, status, recovery FROM $T WHERE status IN ('review', 'released')
) a GROUP BY kind, status, recovery`),
		finishedStats: r.Replace(`SELECT kind, status, recovery, count(*) FROM $T WHERE status IN ('succeeded', 'failed') GROUP BY kind, status, recovery`),
		// PostgreSQL's estimate of the log's rows, as of its last vacuum
		// or analyze; -1 before the first.
		estimate: `SELECT reltuples::float8 FROM pg_class WHERE oid = '` + strings.ReplaceAll(table, `'`, `''`) + `'::regclass`,
		// Finished actions past their own deadline (retain_until, set
		// from the retention their kind had when they were claimed); the
		// Older variants take those not updated for $1 (positive)
		// whatever it says. Two statements, not one with a CASE: a
		// generic plan of the CASE could use no index and read the log.
		purge:           r.Replace(strings.ReplaceAll(purgeStmt, "$DUE", purgeDue)),
		purgeOlder:      r.Replace(strings.ReplaceAll(purgeStmt, "$DUE", purgeOlder)),
		purgeCount:      r.Replace(strings.ReplaceAll(purgeCountStmt, "$DUE", purgeDue)),
		purgeCountOlder: r.Replace(strings.ReplaceAll(purgeCountStmt, "$DUE", purgeOlder)),
		get:             r.Replace(`SELECT $C FROM $T WHERE key = $1`),
		list:            r.Replace(`SELECT $C FROM $T`),
		// A waiter's poll: where the action stands, without its payload.
		state: r.Replace(`SELECT status, attempt FROM $T WHERE key = $1`),
		// A waiter marks the row, so its next transition notifies, and
		// learns whether the row still stands where it saw it. Marked
		// already (by another waiter): no write. Not marked: the update
		// takes the row lock, so a transition either committed first (the
		// update then matches nothing, and the waiter claims again) or
		// runs after it and sees the mark.
		await: r.Replace(`
WITH cur AS (
    SELECT waiters FROM $T WHERE key = $1 AND $S = $2 AND attempt = $3
), u AS (
    UPDATE $T SET waiters = true WHERE key = $1 AND $S = $2 AND attempt = $3 AND NOT waiters
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM cur WHERE waiters) OR EXISTS (SELECT 1 FROM u)`),
	}
}

// qualified is the column list cols with each column qualified by
// alias.
func qualified(alias, cols string) string {
	fields := strings.Split(cols, ", ")
	for i, f := range fields {
		fields[i] = alias + "." + f
	}
	return strings.Join(fields, ", ")
}

// scanAction scans the column list, plus extra destinations (see
// actionRow).
func scanAction(row pgx.Row, a *once.Action, extra ...any) error {
	return row.Scan(&actionRow{a: a, extra: extra})
}

// scanPositional scans the column list, plus extra destinations, one
// destination to a column: what pgx reads in any format.
func scanPositional(row pgx.Row, a *once.Action, extra ...any) error {
	var key, fp, status string
	var result []byte
	var lease, completed, resolved, retain *time.Time
	var recovery string
	var retention, redriveAfter *int64
	dest := append([]any{&key, &fp, &a.Run, &a.Step, &a.Kind, &a.Target, &a.Payload, &status, &a.Attempt,
		&result, &a.Error, &lease, &a.CreatedAt, &a.ClaimedAt, &a.UpdatedAt, &completed,
		&a.VerifyFailures, &a.ResolvedBy, &resolved, &a.ResolveNote, &a.Token, &recovery, &retention, &retain,
		&redriveAfter, &a.Redrive}, extra...)
	if err := row.Scan(dest...); err != nil {
		return err
	}
	a.Key, a.Fingerprint, a.Status = once.Key(key), once.Fingerprint(fp), once.Status(status)
	if result != nil {
		a.Result = result
	}
	if lease != nil {
		a.LeaseUntil = *lease
	}
	if completed != nil {
		a.CompletedAt = *completed
	}
	if resolved != nil {
		a.ResolvedAt = *resolved
	}
	a.Recovery = once.ParseRecovery(recovery)
	if retention != nil {
		a.Retention = time.Duration(*retention) * time.Microsecond
	}
	if retain != nil {
		a.RetainUntil = *retain
	}
	if redriveAfter != nil {
		a.RedriveAfter = time.Duration(*redriveAfter) * time.Microsecond
	}
	return nil
}

// Claim implements once.Store. Unless Config.Unbatched, a claim that
// arrives while batches are in flight waits for a runner and is sent
// with the others queued then, in one transaction.
func (s *Store) Claim(ctx context.Context, req once.ClaimRequest) (once.ClaimResult, error) {
	if s.batched() {
		r := &request{claim: &req}
		if err := s.batch.submit(ctx, r); err != nil {
			return once.ClaimResult{}, s.wrap(err)
		}
		return s.claimAnswer(ctx, req, r)
	}
	res, err := s.claimOne(ctx, req)
	return s.claimRest(ctx, req, res, err)
}

// claimAnswer finishes a claim from its batch's answer: sent again
// alone when the batch asks, read again when its statement found no
// row.
func (s *Store) claimAnswer(ctx context.Context, req once.ClaimRequest, r *request) (once.ClaimResult, error) {
	if r.alone {
		res, err := s.claimOne(ctx, req)
		return s.claimRest(ctx, req, res, err)
	}
	return s.claimRest(ctx, req, r.cr, r.err)
}

// claimOne runs the claim's statement: a new row, or the standing one.
func (s *Store) claimOne(ctx context.Context, req once.ClaimRequest) (once.ClaimResult, error) {
	var res once.ClaimResult
	q := s.q.claim
	if s.inTx {
		q = s.q.claimInTx
	}
	err := scanAction(s.db.QueryRow(ctx, q, claimArgs(req)...), &res.Action, &res.Claimed, &res.Now)
	return res, err
}

// claimRest follows the claim's statement: a row it could not see is
// read again, and a released one claimed again.
func (s *Store) claimRest(ctx context.Context, req once.ClaimRequest, res once.ClaimResult, err error) (once.ClaimResult, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		// The conflicting row was committed after this statement's
		// snapshot was taken; read it with a fresh one.
		res = once.ClaimResult{}
		err = scanAction(s.db.QueryRow(ctx, s.q.selectRow, string(req.Key)), &res.Action, &res.Claimed, &res.Now)
		if errors.Is(err, pgx.ErrNoRows) {
			return res, s.wrap(fmt.Errorf("claim of %s raced with a purge; try again", req.Key))
		}
	}
	if err != nil || res.Claimed || res.Action.Status != once.StatusReleased || res.Action.Fingerprint != req.Fingerprint {
		return res, s.wrap(err)
	}
	var re once.ClaimResult
	err = scanAction(s.db.QueryRow(ctx, s.q.reclaim, string(req.Key), string(req.Fingerprint), req.Lease.Microseconds(), req.Token,
		storekit.RecoveryText(req.Recovery), optMicros(req.Retention), optMicros(req.RedriveAfter), req.Redrive, req.Origin),
		&re.Action, &re.Claimed, &re.Now)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another attempt claimed it first; the caller reads again.
		return res, nil
	}
	return re, s.wrap(err)
}

// Heartbeat implements once.Store.
func (s *Store) Heartbeat(ctx context.Context, key once.Key, attempt int, lease time.Duration) (time.Time, bool, error) {
	var until time.Time
	err := s.db.QueryRow(ctx, s.q.heartbeat, string(key), attempt, lease.Microseconds()).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, s.wrap(err)
	}
	return until, true, nil
}

// Transition implements once.Store. Unless Config.Unbatched, it is
// batched as Claim is.
func (s *Store) Transition(ctx context.Context, t once.Transition) (bool, error) {
	if err := s.keepOutcome(ctx, t); err != nil {
		return false, err
	}
	if s.batched() {
		r := &request{transition: &t}
		if err := s.batch.submit(ctx, r); err != nil {
			return false, s.wrap(err)
		}
		return s.transitionAnswer(ctx, t, r)
	}
	ok, err := s.transitionOne(ctx, t)
	return ok, s.wrap(err)
}

// transitionAnswer is a transition's answer from its batch, or its own
// when the batch asks for it to be sent alone.
func (s *Store) transitionAnswer(ctx context.Context, t once.Transition, r *request) (bool, error) {
	if r.alone {
		ok, err := s.transitionOne(ctx, t)
		return ok, s.wrap(err)
	}
	return r.applied, s.wrap(r.err)
}

// transitionOne runs the transition's statement.
func (s *Store) transitionOne(ctx context.Context, t once.Transition) (bool, error) {
	var n, notified int64
	if err := s.db.QueryRow(ctx, s.q.transition, transitionArgs(t)...).Scan(&n, &notified); err != nil {
		return false, err
	}
	return n == 1, nil
}

// keepOutcome writes out the unwritten outcome of a first attempt before
// a transition from succeeded or failed (a person's decision on a failed
// action) changes the row that describes it. Written first, and on its
// own: when the transition then loses its race, the trail holds an
// outcome that did happen, as it would have in full.
func (s *Store) keepOutcome(ctx context.Context, t once.Transition) error {
	if t.Attempt != 1 {
		return nil
	}
	if !slices.Contains(t.From, once.StatusFailed) && !slices.Contains(t.From, once.StatusSucceeded) {
		return nil
	}
	if s.inTx {
		return s.wrap(s.writeOutcome(ctx, s.db, t.Key))
	}
	return s.wrap(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return s.writeOutcome(ctx, tx, t.Key) }))
}

// writeOutcome locks the action's row, then writes its outcome out. The
// lock comes first, in a statement of its own, so that the insert's
// snapshot is taken after whoever held the row committed: another
// decision that wrote the same outcome out (the insert then sees it and
// writes nothing), or a purge that deleted the row (then there is no
// row to write from). One statement alone would read a snapshot taken
// before either committed, and write the outcome twice, or for a row
// the purge took, where the event would outlive it.
func (s *Store) writeOutcome(ctx context.Context, db dbtx, key once.Key) error {
	rows, err := db.Query(ctx, s.q.lockOutcome, string(key))
	if err != nil {
		return err
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if rows.CommandTag().RowsAffected() == 0 {
		return nil // gone, or no first attempt's outcome to keep
	}
	_, err = db.Exec(ctx, s.q.outcome, string(key))
	return err
}

func statuses(ss []once.Status) []string {
	out := make([]string, len(ss))
	for i, v := range ss {
		out[i] = string(v)
	}
	return out
}

// Recoverable implements once.Store.
func (s *Store) Recoverable(ctx context.Context, req once.RecoverRequest) ([]once.Action, time.Time, error) {
	if req.Token == "" {
		return nil, time.Time{}, errors.New("postgres store: Recoverable needs a hold token")
	}
	var rows pgx.Rows
	var err error
	v := req.Verifiable
	vk, ve, vr := nonNil(v.Kinds), nonNil(v.Except), nonNil(v.Recoveries)
	holds, err := storekit.KindHolds(req.KindHolds, time.Duration.Microseconds)
	if err != nil {
		return nil, time.Time{}, err
	}
	if req.Key != "" {
		rows, err = s.db.Query(ctx, s.q.recoverKey, string(req.Key), req.Hold.Microseconds(), req.Token, vk, v.Others, ve, holds, vr)
	} else {
		var dueBy any
		if !req.DueBy.IsZero() {
			dueBy = req.DueBy
		}
		rows, err = s.db.Query(ctx, s.q.recoverable, max(req.Limit, 1), req.Hold.Microseconds(), req.Token, dueBy, vk, v.Others, ve, holds, vr)
	}
	if err != nil {
		return nil, time.Time{}, s.wrap(err)
	}
	defer rows.Close()
	var now time.Time
	out, err := storekit.Collect(rows, func(r storekit.Rows) (a once.Action, err error) {
		return a, scanAction(r, &a, &now)
	})
	if err != nil {
		return nil, now, s.wrap(err)
	}
	if now.IsZero() {
		if err := s.db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return nil, now, s.wrap(err)
		}
	}
	return out, now, nil
}

// AppendEvent implements once.Store.
func (s *Store) AppendEvent(ctx context.Context, e once.Event) error {
	_, err := s.db.Exec(ctx, s.q.appendEvent, string(e.Key), string(e.Type), e.Attempt, string(e.From), string(e.To), e.Actor, e.Note, e.Origin)
	return s.wrap(err)
}

// Events implements once.Store. The happy path's events, which are not
// written, are made from the action row (storekit.WithHappyPath).
func (s *Store) Events(ctx context.Context, key once.Key) ([]once.Event, error) {
	var a once.Action
	var origin string
	err := scanAction(s.db.QueryRow(ctx, s.q.eventsRow, string(key)), &a, &origin)
	found := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, s.wrap(err)
	}
	stored, err := s.queryEvents(ctx, s.q.events, string(key))
	if err != nil || !found {
		// No row (purged, or a refused outcome of one that never was):
		// the trail is what was written.
		return stored, err
	}
	return storekit.WithHappyPath(a, origin, stored), nil
}

// EventPage implements once.Store.
func (s *Store) EventPage(ctx context.Context, q once.EventQuery) (once.EventPage, error) {
	var a once.Action
	var origin string
	err := scanAction(s.db.QueryRow(ctx, s.q.eventsRow, string(q.Key)), &a, &origin)
	found := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return once.EventPage{}, s.wrap(err)
	}
	var info storekit.TrailInfo
	var completed *time.Time
	if !a.CompletedAt.IsZero() {
		completed = &a.CompletedAt
	}
	if err := s.db.QueryRow(ctx, s.q.trailInfo, string(q.Key), string(a.Status), completed).Scan(
		&info.Written, &info.Claimed, &info.ClaimOrigin, &info.Decided, &info.FirstAfter); err != nil {
		return once.EventPage{}, s.wrap(err)
	}
	after, limit := storekit.PageCursor(q)
	stmt := s.q.eventsAfter
	if q.Newest {
		stmt = s.q.eventsBefore
	}
	rows, err := s.queryEvents(ctx, stmt, string(q.Key), after, limit+1)
	if err != nil {
		return once.EventPage{}, err
	}
	return storekit.Page(a, found, origin, info, rows, q, limit), nil
}

// RecentEvents implements once.Store.
func (s *Store) RecentEvents(ctx context.Context, types []once.EventType, limit int) ([]once.Event, error) {
	ts := make([]string, len(types))
	for i, t := range types {
		ts[i] = string(t)
	}
	return s.queryEvents(ctx, s.q.recent, ts, max(limit, 1))
}

// Versions implements once.Migrator: every migration version the schema
// records, in order, none if it has no migration table. A build refuses
// a schema migrated by a newer one, or one whose record has a gap.
func (s *Store) Versions(ctx context.Context) ([]int, error) {
	var exists bool
	mt := s.names.Table("migration")
	if err := s.db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, mt).Scan(&exists); err != nil {
		return nil, s.wrap(err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := s.db.Query(ctx, `SELECT version FROM `+mt+` ORDER BY version`)
	if err != nil {
		return nil, s.wrap(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	return vs, s.wrap(err)
}

// Version implements once.Store.
func (s *Store) Version(ctx context.Context) (int, error) {
	var exists bool
	mt := s.names.Table("migration")
	if err := s.db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, mt).Scan(&exists); err != nil {
		return 0, s.wrap(err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	err := s.db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+mt).Scan(&v)
	return v, s.wrap(err)
}

func (s *Store) queryEvents(ctx context.Context, stmt string, args ...any) ([]once.Event, error) {
	return query(ctx, s, storekit.ScanEvent(func(t time.Time) time.Time { return t }), stmt, args...)
}

// query runs a query and scans every row with scan.
func query[T any](ctx context.Context, s *Store, scan func(storekit.Rows) (T, error), stmt string, args ...any) ([]T, error) {
	rows, err := s.db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, s.wrap(err)
	}
	defer rows.Close()
	out, err := storekit.Collect(rows, scan)
	return out, s.wrap(err)
}

// Purge implements once.Store.
func (s *Store) Purge(ctx context.Context, req once.PurgeRequest) (int, error) {
	var n, notified int
	var err error
	purge, count := s.q.purge, s.q.purgeCount
	if req.OlderThan > 0 {
		purge, count = s.q.purgeOlder, s.q.purgeCountOlder
	}
	if req.DryRun {
		err = s.db.QueryRow(ctx, count, req.OlderThan.Microseconds()).Scan(&n)
	} else {
		err = s.db.QueryRow(ctx, purge, req.OlderThan.Microseconds(), max(req.Limit, 1)).Scan(&n, &notified)
	}
	return n, s.wrap(err)
}

func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

// optMicros is a duration in microseconds, zero as NULL.
func optMicros(d time.Duration) any {
	if d == 0 {
		return nil
	}
	return d.Microseconds()
}

// Get implements once.Store.
func (s *Store) Get(ctx context.Context, key once.Key) (once.Action, error) {
	var a once.Action
	err := scanAction(s.db.QueryRow(ctx, s.q.get, string(key)), &a)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, fmt.Errorf("%w: %s", once.ErrNotFound, key)
	}
	return a, s.wrap(err)
}

// List implements once.Store.
func (s *Store) List(ctx context.Context, f once.Filter) ([]once.Action, error) {
	clause, args := storekit.ListClause(f, listDialect)
	head := s.q.list
	if f.Brief {
		head = s.q.listBrief
	}
	return query(ctx, s, scanOne, head+clause, args...)
}

// Count implements once.Store.
func (s *Store) Count(ctx context.Context, f once.Filter) (int64, error) {
	clause, args := storekit.CountClause(f, listDialect)
	var n int64
	err := s.db.QueryRow(ctx, s.q.count+clause, args...).Scan(&n)
	return n, s.wrap(err)
}

// listDialect is how List writes its filters.
var listDialect = storekit.Dialect{
	Placeholder: func(n int) string { return "$" + strconv.Itoa(n) },
	Time:        func(t time.Time) any { return t },
	Waiting: func(def string) string {
		return `status = 'released' AND updated_at < now() - coalesce(redrive_after_us, ` + def + `::bigint)::float8 * interval '1 microsecond'`
	},
	Duration: func(d time.Duration) any { return d.Microseconds() },
	Now:      "now()",
}

// scanOne scans one action.
func scanOne(r storekit.Rows) (a once.Action, err error) { return a, scanAction(r, &a) }

// Migrations returns the schema migrations rendered for this store's
// schema and prefix, for users who run their own migration tool.
func (s *Store) Migrations() ([]once.Migration, error) {
	return storekit.LoadMigrations(migrationFS, "migrations", s.names)
}

// Migrate implements once.Store. It takes a transaction-scoped advisory
// lock, so concurrent migrators apply each version once, and it records
// each version in the migration table in the same transaction as the
// change. Like Open, it refuses a pool that prepares statements through
// a pooler Config.Pooler does not name: for a store New made, it is
// the first statement that can tell.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.MigrateApplied(ctx)
	return err
}

// MigrateApplied implements once.Migrator: it is Migrate, and returns
// the migrations this call ran, none when another migrator ran them
// first.
func (s *Store) MigrateApplied(ctx context.Context) ([]once.Migration, error) {
	if s.inTx {
		return nil, errors.New("postgres store: Migrate cannot run inside a caller's transaction")
	}
	ms, err := s.Migrations()
	if err != nil {
		return nil, err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, s.wrap(err)
	}
	defer tx.Rollback(ctx)
	if err := s.checkPooled(ctx, tx.Conn()); err != nil {
		return nil, err
	}
	h := fnv.New64a()
	h.Write([]byte("once.migrate:" + s.names.Table("migration")))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(h.Sum64())); err != nil {
		return nil, s.wrap(err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, s.schema).Scan(&exists); err != nil {
		return nil, s.wrap(err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA `+quoteIdent(s.schema)); err != nil {
			return nil, s.wrap(err)
		}
	}
	ran, err := storekit.ApplyMigrations(ctx, storekit.MigrationTx{
		Exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := tx.Exec(ctx, sql, args...)
			return err
		},
		Ints: func(ctx context.Context, sql string) ([]int, error) {
			rows, err := tx.Query(ctx, sql)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return storekit.Collect(rows, storekit.ScanInt)
		},
		Table: s.names.Table("migration"),
		Columns: `(
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`,
		Placeholder: func(n int) string { return "$" + strconv.Itoa(n) },
	}, ms)
	if err != nil {
		return nil, s.wrap(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, s.wrap(err)
	}
	return ran, nil
}

// Wait implements once.Waiter. It marks the row, so the transition that
// moves it on notifies this store's listening connection, and reads the
// row every 250ms, backing off to every second, in case a notification
// is lost. Each read borrows a connection of the pool for that read
// only. Bound to a caller's transaction, it reads through the
// transaction and marks nothing: a mark would hold the row's lock until
// the transaction ends, and with it the outcome it waits for. A
// transaction that is not READ COMMITTED cannot see the outcome land:
// Wait refuses it at once.
func (s *Store) Wait(ctx context.Context, req once.WaitRequest) error {
	if s.inTx {
		// Only a READ COMMITTED transaction reads each statement with a
		// fresh snapshot; in any other, the outcome would never show.
		var level string
		if err := s.db.QueryRow(ctx, `SELECT current_setting('transaction_isolation')`).Scan(&level); err != nil {
			return s.wrap(err)
		}
		if level != "read committed" {
			return fmt.Errorf("postgres store: cannot wait inside a %s transaction: its snapshot never sees the outcome of the attempt in flight; begin the transaction READ COMMITTED (the default), or wait with Do outside it", strings.ToUpper(level))
		}
	}
	var wake <-chan struct{}
	// Only an attempt in flight is marked: its outcome is a transition,
	// which notifies. A released row moves on by a claim, which does
	// not, and a DoTx claiming it holds its lock, which a mark would
	// wait on.
	mark := !s.inTx && req.Status == once.StatusInFlight
	if s.listen != nil {
		ch, unsubscribe := s.listen.subscribe(req.Key)
		defer unsubscribe()
		wake = ch
		// A store that found its notifications lost does not make the
		// next transition notify for nothing.
		mark = mark && s.listen.usable()
	} else {
		mark = false
		s.pollNote()
	}
	until := time.NewTimer(time.Until(req.Until))
	defer until.Stop()
	every := s.pollMin
	for first := true; ; first = false {
		moved, err := s.moved(ctx, req, first && mark)
		switch {
		case err == nil && moved:
			return nil
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		}
		// A read that failed (the database out of reach for a moment)
		// is made again at the next turn.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closed:
			return fmt.Errorf("%s: closed while waiting; nothing more can be read from it", s)
		case <-until.C:
			return nil
		case <-wake:
			return nil
		case <-time.After(every):
		}
		every = min(every*2, s.pollMax)
	}
}

// moved reads whether the action has moved on from req, and with mark
// marks it for a notification.
func (s *Store) moved(ctx context.Context, req once.WaitRequest, mark bool) (bool, error) {
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if !s.inTx {
		// Cancelling a statement aborts the transaction it runs in: only
		// the store's own statements get a deadline of their own.
		rctx, cancel = context.WithDeadline(ctx, req.Until)
	}
	defer cancel()
	if mark {
		var stands bool
		if err := s.conns.QueryRow(rctx, s.q.await, string(req.Key), string(req.Status), req.Attempt).Scan(&stands); err != nil {
			return false, s.wrap(err)
		}
		return !stands, nil
	}
	var status string
	var attempt int
	err := s.db.QueryRow(rctx, s.q.state, string(req.Key)).Scan(&status, &attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return req.Moved(false, "", 0), nil
	}
	if err != nil {
		return false, s.wrap(err)
	}
	return req.Moved(true, once.Status(status), attempt), nil
}
