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

const columns = `key, fingerprint, run_id, step, kind, target, payload, status, attempt, result, error, lease_until, created_at, claimed_at, updated_at, completed_at, verify_failures, resolved_by, resolved_at, resolve_note, token, recovery, retention_us, retain_until, redrive_after_us, redrive, on_expiry`

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

// queriesSQL holds the store's statements, one named query each
// (storekit.LoadQueries).
//
//go:embed queries.sql
var queriesSQL embed.FS

// sqlQueries are queries.sql's statements by name, read once: the file
// is embedded, so a fault in it fails every test, not a user.
var sqlQueries = sync.OnceValue(func() map[string]string {
	qs, err := storekit.LoadQueries(queriesSQL, "queries.sql")
	if err != nil {
		panic("postgres store: " + err.Error())
	}
	return qs
})

// namedQuery is the statement queries.sql names name.
func namedQuery(name string) string {
	q, ok := sqlQueries()[name]
	if !ok {
		panic("postgres store: queries.sql has no query " + name)
	}
	return q
}

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
	q := func(name string) string { return r.Replace(namedQuery(name)) }
	// A purge's statement with $DUE, which finished actions are due.
	purge := func(stmt, due string) string {
		return r.Replace(strings.ReplaceAll(namedQuery(stmt), "$DUE", namedQuery(due)))
	}
	return queries{
		claims:        q("claims"),
		transitions:   q("transitions"),
		claim:         q("claim"),
		claimInTx:     q("claim_in_tx"),
		reclaim:       q("reclaim"),
		selectRow:     q("select_row"),
		heartbeat:     q("heartbeat"),
		transition:    q("transition"),
		recoverable:   q("recoverable"),
		recoverKey:    q("recover_key"),
		appendEvent:   q("append_event"),
		events:        q("events"),
		trailInfo:     q("trail_info"),
		eventsAfter:   q("events_after"),
		eventsBefore:  q("events_before"),
		eventsRow:     q("events_row"),
		lockOutcome:   q("lock_outcome"),
		outcome:       q("outcome"),
		recent:        q("recent"),
		stats:         q("stats"),
		openStats:     q("open_stats"),
		finishedStats: q("finished_stats"),
		get:           q("get"),
		list:          q("list"),
		state:         q("state"),
		await:         q("await"),
		listBrief:     `SELECT ` + storekit.BriefColumns(columns, "NULL::bytea", "NULL::json") + ` FROM ` + table,
		count:         `SELECT count(*) FROM ` + table,
		// PostgreSQL's estimate of the log's rows, as of its last vacuum
		// or analyze; -1 before the first.
		estimate: `SELECT reltuples::float8 FROM pg_class WHERE oid = '` + strings.ReplaceAll(table, `'`, `''`) + `'::regclass`,
		// Finished actions past their own deadline (retain_until, set
		// from the retention their kind had when they were claimed); the
		// Older variants take those not updated for $1 (positive)
		// whatever it says.
		purge:           purge("purge", "purge_due_where"),
		purgeOlder:      purge("purge", "purge_older_where"),
		purgeCount:      purge("purge_count", "purge_due_where"),
		purgeCountOlder: purge("purge_count", "purge_older_where"),
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
	var onExpiry string
	dest := append([]any{&key, &fp, &a.Run, &a.Step, &a.Kind, &a.Target, &a.Payload, &status, &a.Attempt,
		&result, &a.Error, &lease, &a.CreatedAt, &a.ClaimedAt, &a.UpdatedAt, &completed,
		&a.VerifyFailures, &a.ResolvedBy, &resolved, &a.ResolveNote, &a.Token, &recovery, &retention, &retain,
		&redriveAfter, &a.Redrive, &onExpiry}, extra...)
	if err := row.Scan(dest...); err != nil {
		return err
	}
	a.Key, a.Fingerprint, a.Status, a.OnExpiry = once.Key(key), once.Fingerprint(fp), once.Status(status), once.Status(onExpiry)
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
	if err != nil || res.Claimed || !res.Action.Status.Claimable() || res.Action.Fingerprint != req.Fingerprint {
		return res, s.wrap(err)
	}
	var re once.ClaimResult
	err = scanAction(s.db.QueryRow(ctx, s.q.reclaim, string(req.Key), string(req.Fingerprint), req.Lease.Microseconds(), req.Token,
		storekit.RecoveryText(req.Recovery), optMicros(req.Retention), optMicros(req.RedriveAfter), req.Redrive, req.Origin,
		req.Unconfigured, refuse(req), string(res.Action.Status)),
		&re.Action, &re.Claimed, &re.Now)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another attempt claimed it first; the caller reads again.
		return res, nil
	}
	re.From = res.Action.Status
	return re, s.wrap(err)
}

// refuse is req.Refuse as the reclaim statement takes it: never NULL.
func refuse(req once.ClaimRequest) []string {
	if req.Refuse == nil {
		return []string{}
	}
	return req.Refuse
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
		return `status IN ('released', 'approved') AND updated_at < now() - coalesce(redrive_after_us, ` + def + `::bigint)::float8 * interval '1 microsecond'`
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
	// Only an attempt in flight, or a wait for approval, is marked: its
	// outcome (a decision) is a transition, which notifies. A released
	// row moves on by a claim, which does not, and a DoTx claiming it
	// holds its lock, which a mark would wait on.
	mark := !s.inTx && (req.Status == once.StatusInFlight || req.Status == once.StatusAwaitingApproval)
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
