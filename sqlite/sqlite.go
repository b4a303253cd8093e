// Package sqlite is the SQLite store for once, on modernc.org/sqlite (pure
// Go, no cgo). It is the embedded default: one database file on one
// machine, no server to run. Several processes on that machine may share
// the file; SQLite's file locks arbitrate their claims as PostgreSQL's
// primary key does for the postgres store. Do not put the file on a
// network file system: SQLite's locking, and WAL's shared memory, are only
// sound on a local disk.
//
// Every connection runs in WAL mode, so readers (the console, `once
// list`) never block a claim, with synchronous=FULL, so a recorded outcome
// survives a power cut and not just a crash. Write transactions begin
// IMMEDIATE and wait for the lock under a busy timeout, so processes racing
// for the same key queue up instead of failing with "database is locked".
// Within a process, the claims, outcomes and heartbeats that queue behind
// a write in progress commit together, in one transaction (group.go;
// Config.Unbatched turns it off).
package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/oncehq/once"
	"github.com/oncehq/once/storekit"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Config names the store's tables. A SQLite file has no schemas; a prefix
// is enough to keep once's tables apart from the application's.
type Config struct {
	// Prefix starts every table and index name. Empty means "once_".
	Prefix string
	// ReadOnly opens an existing file for reading only, for tools that
	// only look: it takes no lock a writer would wait for, and it
	// creates no file. When no process has the database open (it has no
	// -wal file), SQLite would create the -wal and -shm files even to
	// read, and could not remove them after, so the file is then read as
	// immutable: a process that opens it for writing meanwhile is not
	// seen, and a read that meets its checkpoint may fail; read again.
	// So it is too when the -wal file is empty and no process has the
	// database open (its -shm file was never sized), but the -shm cannot
	// be read: what a writer whose Open failed on a full disk leaves.
	// A write through a read-only store fails.
	ReadOnly bool
	// Unbatched turns group commit off: each claim of a new key, each
	// outcome and each heartbeat is a transaction of its own, with a
	// commit of its own. By default (false) those that queue up behind
	// another write of the store are committed together, in one
	// transaction (see group.go), which concurrent workers need to get
	// past one commit at a time; a lone write runs at once either way.
	Unbatched bool
}

// check fills in cfg's defaults and checks it.
func (cfg Config) check() (Config, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "once_"
	}
	return cfg, storekit.CheckIdent("sqlite: Config.Prefix", cfg.Prefix, false)
}

// Migrations returns the schema migrations rendered for cfg's prefix,
// without a database: what a store's Migrations returns, for users who
// run their own migration tool.
func Migrations(cfg Config) ([]once.Migration, error) {
	cfg, err := cfg.check()
	if err != nil {
		return nil, err
	}
	return storekit.LoadMigrations(migrationFS, "migrations", storekit.Names{Prefix: cfg.Prefix, Quote: quoteIdent})
}

// busyTimeout is how long a statement waits for another connection or
// process to release the database's write lock before it fails. Claims
// are short, so the wait is only long under a pile-up; it is generous
// because failing a claim costs a job a trip back to its queue.
const busyTimeout = 10 * time.Second

// dsnParams are applied by the driver to every connection the pool opens.
// The driver runs busy_timeout before the other pragmas whatever their
// order, so they too wait for a lock another process holds (but for one
// case of the switch to WAL, which Open sees to). _txlock=immediate makes
// BeginTx issue BEGIN IMMEDIATE: a transaction that reads before it writes
// would otherwise find, when it tries to write, that another process wrote
// first, and SQLite fails that upgrade at once, busy timeout or not.
var dsnParams = "_pragma=busy_timeout(" + strconv.FormatInt(busyTimeout.Milliseconds(), 10) + ")" +
	"&_pragma=journal_mode(WAL)" +
	"&_pragma=synchronous(FULL)" +
	"&_pragma=foreign_keys(1)" +
	"&_txlock=immediate"

// dbtx is what a *sql.DB and a *sql.Tx have in common.
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Store is a once.Store on SQLite.
type Store struct {
	db    dbtx
	sqlDB *sql.DB
	inTx  bool
	// ownTx is the transaction of inWriteTx, in which the prepared
	// statements run; a caller's transaction (BindTx) may come from
	// another *sql.DB, so it runs their text.
	ownTx *sql.Tx
	path  string
	names storekit.Names
	q     queries
	stmts *statements
	// writer admits this store's writes to SQLite's write lock one at a
	// time; see write.
	writer chan struct{}
	// waiting counts the writers waiting for their turn.
	waiting *atomic.Int64
	// group queues the writes that go together; nil with
	// Config.Unbatched.
	group *group
	// counts is the last count of the finished actions, for Stats.
	counts *storekit.Counts
	// closed is closed by Close: its waiters can read nothing more.
	closed    chan struct{}
	closeOnce *sync.Once
}

var (
	_ once.Store             = (*Store)(nil)
	_ once.TxBinder[*sql.Tx] = (*Store)(nil)
	_ once.Waiter            = (*Store)(nil)
	_ once.Migrator          = (*Store)(nil)
)

// Open opens the database file at path, creating it if it does not exist,
// and returns a store that owns it; Close closes it. It opens a connection
// and takes the write lock once, so a missing directory, a read-only file
// or a file that is not a database is reported here, by path, rather than
// by the first claim.
func Open(path string, cfg Config) (*Store, error) {
	cfg, err := cfg.check()
	if err != nil {
		return nil, err
	}
	switch {
	case path == "":
		return nil, errors.New("sqlite store: the path is empty; pass the database file, such as ./once.db")
	case path == ":memory:":
		// Every connection of the pool would get a database of its own,
		// so claims would not see each other.
		return nil, errors.New("sqlite store: an in-memory database cannot arbitrate claims; pass a file path")
	case strings.HasPrefix(path, "file:"):
		return nil, fmt.Errorf("sqlite store: %q is a URI; pass a plain file path", path)
	case strings.Contains(path, "?"):
		// The driver splits its parameters off at the first '?'.
		return nil, fmt.Errorf("sqlite store: the path %q contains '?', which the driver reads as the start of its parameters; rename the file", path)
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("sqlite store: %s is a directory; pass a database file, such as %s", path, filepath.Join(path, "once.db"))
	}
	if cfg.ReadOnly {
		return openReadOnly(path, cfg)
	}
	db, err := sql.Open("sqlite", path+"?"+dsnParams)
	if err != nil {
		return nil, fmt.Errorf("sqlite store at %s: %w", path, err)
	}
	// The first connection to a new file switches it to WAL. SQLite fails
	// that switch at once, busy timeout or not, if another process reads
	// the file at the same moment, so of several processes starting
	// together on a new file all but one may be told "database is
	// locked". Once the file is in WAL mode it stays so and the switch is
	// a no-op: trying again settles it.
	deadline := time.Now().Add(busyTimeout)
	for {
		err = check(context.Background(), db)
		if err == nil || !isBusy(err) || time.Now().After(deadline) {
			break
		}
		time.Sleep(openRetryDelay)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite store at %s: %w%s", path, err, hint(err, path))
	}
	return newStore(db, path, cfg), nil
}

func newStore(db *sql.DB, path string, cfg Config) *Store {
	names := storekit.Names{Prefix: cfg.Prefix, Quote: quoteIdent}
	q := buildQueries(names.Table("action"), names.Table("event"))
	var g *group
	if !cfg.Unbatched {
		g = new(group)
	}
	s := &Store{
		group:     g,
		db:        db,
		sqlDB:     db,
		path:      path,
		names:     names,
		q:         q,
		stmts:     newStatements(db, q.text),
		writer:    make(chan struct{}, 1),
		waiting:   new(atomic.Int64),
		closed:    make(chan struct{}),
		closeOnce: new(sync.Once),
	}
	s.counts = newCounts(s)
	return s
}

// openReadOnly opens path for Config.ReadOnly.
func openReadOnly(path string, cfg Config) (*Store, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("sqlite store: %w; a read-only store opens an existing file", err)
	}
	_, err := os.Stat(path + "-wal")
	immutable := errors.Is(err, os.ErrNotExist)
	db, err := openReader(path, immutable)
	if err != nil && !immutable && !isLocked(err) && unopened(path) {
		// An empty -wal beside a -shm no connection ever sized: no
		// process has the database open, and the file holds all of it,
		// as when there is no -wal. A writer's Open that failed there
		// (on a full disk, say) leaves them, and the -shm may not be
		// readable. A file another process holds locked is being opened
		// by it: not read as immutable, so that its writes are seen.
		if ro, again := openReader(path, true); again == nil {
			db, err = ro, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sqlite store at %s: %w%s", path, err, hint(err, path))
	}
	return newStore(db, path, cfg), nil
}

// openReader opens path read-only, as immutable or not, and reads its
// schema: a file that is not a database fails at the first read.
func openReader(path string, immutable bool) (*sql.DB, error) {
	params := "mode=ro"
	if immutable {
		params += "&immutable=1"
	}
	params += "&_pragma=busy_timeout(" + strconv.FormatInt(busyTimeout.Milliseconds(), 10) + ")"
	db, err := sql.Open("sqlite", "file:"+neturl.PathEscape(path)+"?"+params)
	if err != nil {
		return nil, err
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_schema`).Scan(&n); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// shmPage is the size of the -shm file's first page, which every
// connection to a database in WAL mode maps before it reads.
const shmPage = 32 << 10

// unopened reports whether the database at path is, by its files, open
// in no process: its -wal file is empty (no frame waits to be copied
// into the database), and its -shm is missing or shorter than the page
// every connection maps.
func unopened(path string) bool {
	wal, err := os.Stat(path + "-wal")
	if err != nil || wal.Size() != 0 {
		return false
	}
	shm, err := os.Stat(path + "-shm")
	return errors.Is(err, os.ErrNotExist) || (err == nil && shm.Size() < shmPage)
}

// openRetryDelay spaces Open's attempts while the file is being switched
// to WAL by another process, which takes milliseconds.
const openRetryDelay = 5 * time.Millisecond

// check proves the file is a database this process can write, in WAL mode.
func check(ctx context.Context, db *sql.DB) error {
	// The first connection applies the DSN's pragmas: opening the file and
	// switching it to WAL fail here if either is impossible.
	if err := db.PingContext(ctx); err != nil {
		return err
	}
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return err
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal mode is %q, not WAL; is the file on a local disk?", mode)
	}
	// SQLite opens a file it may not write read-only without a word;
	// taking the write lock is what tells.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	return tx.Rollback()
}

func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

// isLocked reports whether err is SQLite's busy or locked: another
// connection holds what was asked for.
func isLocked(err error) bool {
	var se *sqlite.Error
	return isBusy(err) || errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_LOCKED
}

// hint says what to look at for the errors opening the file at path
// commonly meets. A full disk shows as "disk I/O error" as often as
// "database or disk is full" (SQLite sizes the -shm file, and fails
// with SQLITE_IOERR_SHMSIZE): where the file system has little space
// left, the hint says so, and not to look at the directory.
func hint(err error, path string) string {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return ""
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN:
		if free, ok := diskFree(filepath.Dir(path)); ok && free < lowSpace {
			return fmt.Sprintf("; the file system holding it has %d bytes free: is the disk full?", free)
		}
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH, sqlite3.SQLITE_IOERR:
		return "; does the directory exist and is it writable?"
	case sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT:
		return "; is it an SQLite database?"
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return "; another process kept it locked for over " + busyTimeout.String()
	}
	return ""
}

// lowSpace is free space below which an I/O error opening a file is
// put down to a full disk: less than SQLite needs to open a database
// and write a few transactions (the -shm's page, the -wal's frames).
const lowSpace = 1 << 20

// Close closes the database; calls waiting through the store (WaitFor)
// stop waiting and answer at once. On a store bound to a transaction it
// does nothing: the store it was bound from owns the database.
func (s *Store) Close() error {
	if s.inTx {
		return nil
	}
	// Waiters first: a read of the closed database tells them nothing.
	s.closeOnce.Do(func() { close(s.closed) })
	s.counts.Close()
	s.stmts.close()
	return s.sqlDB.Close()
}

// DB returns the store's database, to begin the transactions DoTx joins.
// They begin IMMEDIATE, holding the write lock from the start.
func (s *Store) DB() *sql.DB { return s.sqlDB }

// String names the store and its file, for messages.
func (s *Store) String() string { return "sqlite store at " + s.path }

// BindTx returns a store whose statements run in tx, which should be
// begun on DB(). once.DoTx calls it. A transaction begun on another
// *sql.DB should begin IMMEDIATE too, or a claim that follows a read in it
// can fail at once with "database is locked".
func (s *Store) BindTx(tx *sql.Tx) once.Store {
	c := *s
	c.db, c.inTx, c.ownTx = tx, true, nil
	return &c
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func (s *Store) wrap(err error) error {
	if err == nil {
		return nil
	}
	if rejected(err) {
		return fmt.Errorf("%s: %w: %w", s, once.ErrRejected, err)
	}
	return fmt.Errorf("%s: %w", s, err)
}

// rejected reports an error about the data itself: a constraint (a
// result that is not JSON to SQLite, a status it does not know), a type
// mismatch, a value too big. Sending the same again gets the same answer.
func rejected(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_RANGE:
		return true
	}
	return false
}

// nowMS is the database's clock in milliseconds since the Unix epoch.
// SQLite keeps 'now' to the millisecond and holds it fixed for the whole
// of one statement, so every use within a statement agrees. ROUND undoes
// the floating-point error of 'subsec' seconds times 1000.
const nowMS = `CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)`

// columns is the row as scanAction reads it. The last column tells a NULL
// payload from an empty one, which the driver returns alike.
const columns = `key, fingerprint, run_id, step, kind, target, payload, status, attempt, result, error, lease_until, created_at, claimed_at, updated_at, completed_at, verify_failures, resolved_by, resolved_at, resolve_note, token, recovery, retention_ms, retain_until, redrive_after_ms, redrive, payload IS NULL, on_expiry`

const eventColumns = `id, key, at, type, attempt, from_status, to_status, actor, note, origin`

// queries are the store's statements: those it prepares once (text, by
// stmtID), and the action list's head, to which each call adds its own
// clause.
type queries struct {
	text [nStmt]string
	// list, listBrief and count head a list, a brief list and a count,
	// to which each call adds its own clause.
	list, listBrief, count string
}

// queriesSQL holds the store's statements, one named query each
// (storekit.LoadQueries).
//
//go:embed queries.sql
var queriesSQL embed.FS

// stmtNames are the names in queries.sql of the statements stmtID
// numbers.
var stmtNames = [nStmt]string{
	stClaim: "claim", stReclaim: "reclaim", stSelectRow: "select_row", stHeartbeat: "heartbeat",
	stTransition: "transition", stOutcome: "outcome", stBackfill: "backfill", stEvent: "event",
	stGet: "get", stState: "state", stEventsRow: "events_row", stEvents: "events",
	stTrailInfo: "trail_info", stEventsAfter: "events_after", stEventsBefore: "events_before",
	stRecent: "recent", stRecoverable: "recoverable", stRecoverKey: "recover_key",
	stStats: "stats", stOpenStats: "open_stats", stFinishedStats: "finished_stats",
	stEstimate: "estimate", stPurgeDue: "purge_due", stPurgeOlder: "purge_older",
	stPurgeEvents: "purge_events", stCountDue: "count_due", stCountOlder: "count_older", stNow: "now",
}

// sqlQueries are queries.sql's statements by name, read once: the file
// is embedded, so a fault in it fails every test, not a user.
var sqlQueries = sync.OnceValue(func() map[string]string {
	qs, err := storekit.LoadQueries(queriesSQL, "queries.sql")
	if err != nil {
		panic("sqlite store: " + err.Error())
	}
	return qs
})

// namedQuery is the statement queries.sql names name.
func namedQuery(name string) string {
	q, ok := sqlQueries()[name]
	if !ok {
		panic("sqlite store: queries.sql has no query " + name)
	}
	return q
}

func buildQueries(table, events string) queries {
	r := strings.NewReplacer("$T", table, "$E", events, "$C", columns, "$V", eventColumns, "$NOW", nowMS,
		"$SEQ", "coalesce((SELECT max(id) FROM "+events+"), 0)")
	// The fragments several statements share go in first.
	frag := strings.NewReplacer("$TRANSITION_SET", namedQuery("transition_set"), "$KIND_HOLD", namedQuery("kind_hold"),
		"$PURGE_DUE", namedQuery("purge_due_where"), "$PURGE_OLDER", namedQuery("purge_older_where"))
	var q queries
	q.list = r.Replace(namedQuery("list"))
	q.listBrief = `SELECT ` + storekit.BriefColumns(columns, "NULL", "NULL") + ` FROM ` + table
	q.count = `SELECT count(*) FROM ` + table
	for id, name := range stmtNames {
		q.text[id] = r.Replace(frag.Replace(namedQuery(name)))
	}
	return q
}

// msTime turns the database's milliseconds into a time in UTC.
func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// leaseMS is a lease in whole milliseconds, rounded up so that a lease is
// never shorter than asked.
func leaseMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// scanOne scans one action.
func scanOne(r storekit.Rows) (a once.Action, err error) { return a, scanAction(r, &a) }

// scanAction scans the column list, plus extra destinations.
func scanAction(row interface{ Scan(...any) error }, a *once.Action, extra ...any) error {
	var key, fp, status string
	var result []byte
	var lease, completed, resolved, retention, retain, redriveAfter sql.NullInt64
	var recovery string
	var created, claimed, updated int64
	var payloadNull bool
	var onExpiry string
	dest := append([]any{&key, &fp, &a.Run, &a.Step, &a.Kind, &a.Target, &a.Payload, &status, &a.Attempt,
		&result, &a.Error, &lease, &created, &claimed, &updated, &completed,
		&a.VerifyFailures, &a.ResolvedBy, &resolved, &a.ResolveNote, &a.Token, &recovery, &retention, &retain, &redriveAfter, &a.Redrive, &payloadNull, &onExpiry}, extra...)
	if err := row.Scan(dest...); err != nil {
		return err
	}
	a.Key, a.Fingerprint, a.Status, a.OnExpiry = once.Key(key), once.Fingerprint(fp), once.Status(status), once.Status(onExpiry)
	if a.Payload == nil && !payloadNull {
		a.Payload = []byte{}
	}
	if result != nil {
		a.Result = result
	}
	if lease.Valid {
		a.LeaseUntil = msTime(lease.Int64)
	}
	a.CreatedAt, a.ClaimedAt, a.UpdatedAt = msTime(created), msTime(claimed), msTime(updated)
	if completed.Valid {
		a.CompletedAt = msTime(completed.Int64)
	}
	if resolved.Valid {
		a.ResolvedAt = msTime(resolved.Int64)
	}
	a.Recovery = once.ParseRecovery(recovery)
	if retention.Valid {
		a.Retention = time.Duration(retention.Int64) * time.Millisecond
	}
	if retain.Valid {
		a.RetainUntil = msTime(retain.Int64)
	}
	if redriveAfter.Valid {
		a.RedriveAfter = time.Duration(redriveAfter.Int64) * time.Millisecond
	}
	return nil
}

// nullBytes keeps a nil slice NULL, as pgx does.
func nullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}

// write runs fn in this process's turn to write. A connection waiting for
// SQLite's write lock polls for it, sleeping up to 100ms between tries,
// so with many waiting at once one can lose every race until its busy
// timeout runs out. Queueing writers here, in order, leaves one poller per
// process and hands the lock from one writer of the process to the next
// without a sleep. A store bound to a caller's transaction already holds
// the lock. The writer done hands the turn on with release.
func (s *Store) write(ctx context.Context, fn func() error) error {
	if s.inTx {
		return fn()
	}
	s.waiting.Add(1)
	select {
	case s.writer <- struct{}{}:
		s.waiting.Add(-1)
	case <-ctx.Done():
		s.waiting.Add(-1)
		return ctx.Err()
	}
	defer s.release()
	return fn()
}

// inWriteTx runs fn in a write transaction: the caller's if the store is
// bound to one, otherwise a new one that holds the write lock from its
// BEGIN. fn gets the store bound to the transaction.
func (s *Store) inWriteTx(ctx context.Context, fn func(*Store) error) error {
	if s.inTx {
		return fn(s)
	}
	// Prepared before the transaction holds a connection: see statements.
	s.stmts.get(ctx, stNow, true)
	return s.write(ctx, func() error {
		tx, err := s.sqlDB.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		c := *s
		c.db, c.inTx, c.ownTx = tx, true, tx
		if err := fn(&c); err != nil {
			return err
		}
		return tx.Commit()
	})
}

// Claim implements once.Store.
//
// SQLite's write lock covers the whole database, not one row, so a claim
// first reads the key without it: a key that is held, or released under
// another fingerprint, is answered from that read, and duplicates do not
// queue behind every writer on the machine. The answer is what the
// insert would have returned at the moment of the read. Only a new or
// reclaimable key takes the write lock: a new key with one statement,
// which is its own transaction; a released one in a transaction that
// claims it again and writes the claim to the trail, or, if it was
// claimed first, reads what stands.
func (s *Store) Claim(ctx context.Context, req once.ClaimRequest) (once.ClaimResult, error) {
	var res once.ClaimResult
	var now int64
	scan := func(r *sql.Rows) error { return scanAction(r, &res.Action, &now) }
	known := false
	if !s.inTx {
		err := s.queryRow(ctx, stSelectRow, scan, string(req.Key))
		switch {
		case err == nil:
			if !res.Action.Status.Claimable() || res.Action.Fingerprint != req.Fingerprint {
				res.Now = msTime(now)
				return res, nil
			}
			known = true
		case !errors.Is(err, sql.ErrNoRows):
			return once.ClaimResult{}, s.wrap(err)
		}
	}
	if !known {
		res = once.ClaimResult{}
		err := s.grouped(ctx, len(req.Payload), func(ctx context.Context, w *Store) error {
			return w.queryRow(ctx, stClaim, func(r *sql.Rows) error { return r.Scan(&now) },
				string(req.Key), string(req.Fingerprint), req.Run, req.Step, req.Kind, req.Target, nullBytes(req.Payload), leaseMS(req.Lease), req.Token,
				storekit.RecoveryText(req.Recovery), optMillis(req.Retention), optMillis(req.RedriveAfter), req.Redrive, req.Origin,
				leaseMS(req.Approval), string(req.OnExpiry))
		})
		if err == nil {
			return once.ClaimResult{Claimed: true, Action: claimedRow(req, now), Now: msTime(now)}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return once.ClaimResult{}, s.wrap(err)
		}
	}
	refuse, err := jsonStrings(req.Refuse)
	if err != nil {
		return once.ClaimResult{}, err
	}
	// The status the read saw, released or approved, is the one the
	// reclaim claims from; without a read (a caller's transaction),
	// released, then approved.
	froms := []once.Status{res.Action.Status}
	if !known {
		froms = []once.Status{once.StatusReleased, once.StatusApproved}
	}
	err = s.inWriteTx(ctx, func(tx *Store) error {
		res = once.ClaimResult{}
		var err error
		for _, from := range froms {
			err = tx.queryRow(ctx, stReclaim, scan, string(req.Key), string(req.Fingerprint), leaseMS(req.Lease), req.Token,
				storekit.RecoveryText(req.Recovery), optMillis(req.Retention), optMillis(req.RedriveAfter), req.Redrive,
				req.Unconfigured, refuse, string(from))
			if err == nil {
				res.Claimed, res.From = true, from
				err = tx.execOnly(ctx, stEvent, string(req.Key), string(once.EventClaimed), res.Action.Attempt, string(from),
					string(once.StatusInFlight), once.ActorWorker, "", req.Origin)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				break
			}
		}
		if errors.Is(err, sql.ErrNoRows) {
			err = tx.queryRow(ctx, stSelectRow, scan, string(req.Key))
			if errors.Is(err, sql.ErrNoRows) {
				// The insert met a row, which a purge has taken since.
				return fmt.Errorf("claim of %s raced with a purge; try again", req.Key)
			}
		}
		if err != nil {
			return err
		}
		res.Now = msTime(now)
		return nil
	})
	if err != nil {
		return once.ClaimResult{}, s.wrap(err)
	}
	return res, nil
}

// claimedRow is the row stClaim inserts for req at now, as scanAction
// reads it.
func claimedRow(req once.ClaimRequest, now int64) once.Action {
	a := once.Action{Key: req.Key, Fingerprint: req.Fingerprint, Run: req.Run, Step: req.Step, Kind: req.Kind, Target: req.Target,
		Payload: bytes.Clone(req.Payload), Status: once.StatusInFlight, Attempt: 1, LeaseUntil: msTime(now + leaseMS(req.Lease)),
		CreatedAt: msTime(now), ClaimedAt: msTime(now), UpdatedAt: msTime(now), Token: req.Token,
		Recovery: once.ParseRecovery(storekit.RecoveryText(req.Recovery)), Redrive: req.Redrive}
	if req.Approval > 0 {
		// Written awaiting approval, lease_until when the wait expires
		// (the claim statement).
		a.Status, a.OnExpiry = once.StatusAwaitingApproval, req.OnExpiry
		a.LeaseUntil = msTime(now + leaseMS(req.Approval))
	}
	if ms, ok := optMillis(req.Retention).(int64); ok {
		a.Retention = time.Duration(ms) * time.Millisecond
	}
	if ms, ok := optMillis(req.RedriveAfter).(int64); ok {
		a.RedriveAfter = time.Duration(ms) * time.Millisecond
	}
	return a
}

// Heartbeat implements once.Store.
func (s *Store) Heartbeat(ctx context.Context, key once.Key, attempt int, lease time.Duration) (time.Time, bool, error) {
	var until int64
	err := s.grouped(ctx, 0, func(ctx context.Context, w *Store) error {
		return w.queryRow(ctx, stHeartbeat, func(r *sql.Rows) error { return r.Scan(&until) }, string(key), attempt, leaseMS(lease))
	})
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, s.wrap(err)
	}
	return msTime(until), true, nil
}

// Transition implements once.Store. The worker's outcome of attempt 1
// writes no event (storekit.Unwritten): it is one statement, its own
// transaction. A transition with an event to write, or one that takes an
// action out of such an outcome, which must then be written first, runs
// in a transaction.
func (s *Store) Transition(ctx context.Context, t once.Transition) (bool, error) {
	var result any
	if len(t.Result) > 0 {
		result = string(t.Result)
	}
	event := storekit.EventToWrite(t)
	size := len(t.Result) + len(t.Error) + len(t.ResolveNote)
	backfill := slices.Contains(t.From, once.StatusSucceeded) || slices.Contains(t.From, once.StatusFailed)
	args := []any{string(t.Key), t.Attempt, string(t.To), result, t.Error,
		t.NewAttempt, leaseMS(t.Lease), t.VerifyFailures, t.ResolvedBy, t.ResolveNote, nil, t.Hold, t.Token,
		once.DefaultRetention.Milliseconds()}
	if event == "" && !backfill && len(t.From) == 1 && !t.Waiting && t.Fingerprint == "" && !t.Unexpired && !t.Expired {
		args[10] = string(t.From[0])
		var n int64
		err := s.grouped(ctx, size, func(ctx context.Context, w *Store) error {
			res, err := w.exec(ctx, stOutcome, args...)
			if err == nil {
				n, err = res.RowsAffected()
			}
			return err
		})
		if err != nil {
			return false, s.wrap(err)
		}
		return n == 1, nil
	}
	from, err := jsonStrings(statusStrings(t.From))
	if err != nil {
		return false, s.wrap(err)
	}
	args[10] = from
	// ?15 and ?16: Transition.Waiting, and the RedriveAfter of a row
	// that recorded none.
	args = append(args, t.Waiting, once.DefaultRedriveAfter.Milliseconds())
	// ?17 to ?19: Transition.Fingerprint, Unexpired and Expired.
	args = append(args, string(t.Fingerprint), t.Unexpired, t.Expired)
	var attempt int
	var status string
	update := func(ctx context.Context, s *Store) error {
		return s.queryRow(ctx, stTransition, func(r *sql.Rows) error { return r.Scan(&attempt, &status) }, args...)
	}
	if event == "" && !backfill {
		err = s.grouped(ctx, size, update)
	} else {
		err = s.inWriteTx(ctx, func(tx *Store) error {
			if backfill {
				if err := tx.execOnly(ctx, stBackfill, string(t.Key), t.Attempt, from, t.Hold); err != nil {
					return err
				}
			}
			if err := update(ctx, tx); err != nil || event == "" {
				return err
			}
			return tx.execOnly(ctx, stEvent, string(t.Key), event, attempt, string(t.Event.From), status, t.Event.Actor, t.Event.Note, t.Event.Origin)
		})
	}
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, s.wrap(err)
	}
	return true, nil
}

func statusStrings(ss []once.Status) []string {
	out := make([]string, len(ss))
	for i, v := range ss {
		out[i] = string(v)
	}
	return out
}

// jsonStrings encodes a list for json_each, so a statement's text is the
// same whatever the list's length.
func jsonStrings(ss []string) (string, error) {
	if ss == nil {
		ss = []string{}
	}
	b, err := json.Marshal(ss)
	return string(b), err
}

// Recoverable implements once.Store.
func (s *Store) Recoverable(ctx context.Context, req once.RecoverRequest) ([]once.Action, time.Time, error) {
	if req.Token == "" {
		return nil, time.Time{}, errors.New("sqlite store: Recoverable needs a hold token")
	}
	var out []once.Action
	var now int64
	err := s.write(ctx, func() error {
		var dueBy any
		if !req.DueBy.IsZero() {
			dueBy = req.DueBy.UnixMilli()
		}
		vk, err := jsonStrings(req.Verifiable.Kinds)
		if err != nil {
			return err
		}
		ve, err := jsonStrings(req.Verifiable.Except)
		if err != nil {
			return err
		}
		vr, err := jsonStrings(req.Verifiable.Recoveries)
		if err != nil {
			return err
		}
		// Both statements number their parameters alike, so one list
		// serves: ?1 is the key or the limit.
		holds, err := storekit.KindHolds(req.KindHolds, leaseMS)
		if err != nil {
			return err
		}
		id, args := stRecoverable, []any{max(req.Limit, 1), leaseMS(req.Hold), req.Token, dueBy, vk, req.Verifiable.Others, ve, holds, vr}
		if req.Key != "" {
			id, args[0] = stRecoverKey, string(req.Key)
		}
		rows, err := s.query(ctx, id, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		out, err = storekit.Collect(rows, func(r storekit.Rows) (a once.Action, err error) {
			return a, scanAction(r, &a, &now)
		})
		if err != nil {
			return err
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if now == 0 {
			return s.queryRow(ctx, stNow, func(r *sql.Rows) error { return r.Scan(&now) })
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, s.wrap(err)
	}
	return out, msTime(now), nil
}

// AppendEvent implements once.Store.
func (s *Store) AppendEvent(ctx context.Context, e once.Event) error {
	return s.wrap(s.write(ctx, func() error {
		return s.execOnly(ctx, stEvent, string(e.Key), string(e.Type), e.Attempt, string(e.From), string(e.To), e.Actor, e.Note, e.Origin)
	}))
}

// Events implements once.Store. The happy path's events, which are not
// written, are made from the action row (storekit.WithHappyPath).
func (s *Store) Events(ctx context.Context, key once.Key) ([]once.Event, error) {
	var a once.Action
	var origin string
	err := s.queryRow(ctx, stEventsRow, func(r *sql.Rows) error { return scanAction(r, &a, &origin) }, string(key))
	found := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, s.wrap(err)
	}
	stored, err := s.queryEvents(ctx, stEvents, string(key))
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
	err := s.queryRow(ctx, stEventsRow, func(r *sql.Rows) error { return scanAction(r, &a, &origin) }, string(q.Key))
	found := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return once.EventPage{}, s.wrap(err)
	}
	var info storekit.TrailInfo
	var completed any
	if !a.CompletedAt.IsZero() {
		completed = a.CompletedAt.UnixMilli()
	}
	if err := s.queryRow(ctx, stTrailInfo, func(r *sql.Rows) error {
		return r.Scan(&info.Written, &info.Claimed, &info.ClaimOrigin, &info.Decided, &info.FirstAfter)
	}, string(q.Key), string(a.Status), completed); err != nil {
		return once.EventPage{}, s.wrap(err)
	}
	after, limit := storekit.PageCursor(q)
	stmt := stEventsAfter
	if q.Newest {
		stmt = stEventsBefore
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
	js, err := jsonStrings(ts)
	if err != nil {
		return nil, s.wrap(err)
	}
	return s.queryEvents(ctx, stRecent, js, max(limit, 1))
}

// Versions implements once.Migrator: every migration version the schema
// records, in order, none if it has no migration table. A build refuses
// a schema migrated by a newer one, or one whose record has a gap.
func (s *Store) Versions(ctx context.Context) ([]int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1`, s.names.Prefix+"migration").Scan(&n); err != nil {
		return nil, s.wrap(err)
	}
	if n == 0 {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, `SELECT version FROM `+s.names.Table("migration")+` ORDER BY version`)
	if err != nil {
		return nil, s.wrap(err)
	}
	defer rows.Close()
	vs, err := storekit.Collect(rows, storekit.ScanInt)
	return vs, s.wrap(err)
}

// Version implements once.Store.
func (s *Store) Version(ctx context.Context) (int, error) {
	mt := s.names.Table("migration")
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1`, s.names.Prefix+"migration").Scan(&n); err != nil {
		return 0, s.wrap(err)
	}
	if n == 0 {
		return 0, nil
	}
	var v int
	err := s.db.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM `+mt).Scan(&v)
	return v, s.wrap(err)
}

func (s *Store) queryEvents(ctx context.Context, id stmtID, args ...any) ([]once.Event, error) {
	rows, err := s.query(ctx, id, args...)
	return collect(s, rows, err, storekit.ScanEvent(msTime))
}

// collect scans every row of a query's rows with scan.
func collect[T any](s *Store, rows *sql.Rows, err error, scan func(storekit.Rows) (T, error)) ([]T, error) {
	if err != nil {
		return nil, s.wrap(err)
	}
	defer rows.Close()
	out, err := storekit.Collect(rows, scan)
	return out, s.wrap(err)
}

// Stats implements once.Store. It counts every action while the log
// holds fewer than storekit.LiveRows finished ones; past that, it counts
// the open ones at each call and takes the finished ones from a count
// made now and then, in the background, whose cells say when (AsOf).
func (s *Store) Stats(ctx context.Context) ([]once.StatusCount, error) {
	if s.inTx {
		rows, err := s.query(ctx, stStats)
		return collect(s, rows, err, storekit.ScanStatusCount)
	}
	all, err := s.counts.Stats(ctx)
	return all, s.wrap(err)
}

// newCounts returns the counts Stats answers from (storekit.Counts).
// The stores BindTx makes share them, but count within their
// transaction.
func newCounts(s *Store) *storekit.Counts {
	cells := func(id stmtID) func(context.Context) ([]once.StatusCount, error) {
		return func(ctx context.Context) ([]once.StatusCount, error) {
			rows, err := s.query(ctx, id)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return storekit.Collect(rows, storekit.ScanStatusCount)
		}
	}
	return storekit.NewCounts(storekit.StatQueries{
		All:      cells(stStats),
		Open:     cells(stOpenStats),
		Finished: cells(stFinishedStats),
		Estimate: func(ctx context.Context) (rows float64, err error) {
			return rows, s.queryRow(ctx, stEstimate, func(r *sql.Rows) error { return r.Scan(&rows) })
		},
	}, nil)
}

// Purge implements once.Store.
func (s *Store) Purge(ctx context.Context, req once.PurgeRequest) (int, error) {
	older := req.OlderThan.Milliseconds()
	if req.DryRun {
		var n int
		id, args := stCountDue, []any{}
		if older > 0 {
			id, args = stCountOlder, []any{older}
		}
		err := s.queryRow(ctx, id, func(r *sql.Rows) error { return r.Scan(&n) }, args...)
		return n, s.wrap(err)
	}
	// The actions first, then the events of exactly those actions, in
	// one transaction.
	var keys []string
	err := s.inWriteTx(ctx, func(tx *Store) error {
		id, args := stPurgeDue, []any{max(req.Limit, 1)}
		if older > 0 {
			id, args = stPurgeOlder, []any{older, max(req.Limit, 1)}
		}
		rows, err := tx.query(ctx, id, args...)
		if err != nil {
			return err
		}
		keys, err = storekit.Collect(rows, storekit.ScanString)
		rows.Close()
		if err != nil {
			return err
		}
		gone, err := jsonStrings(keys)
		if err != nil {
			return err
		}
		return tx.execOnly(ctx, stPurgeEvents, gone)
	})
	n := len(keys)
	return int(n), s.wrap(err)
}

// optMillis is a duration in milliseconds, zero as NULL.
func optMillis(d time.Duration) any {
	if d == 0 {
		return nil
	}
	return d.Milliseconds()
}

// Get implements once.Store.
func (s *Store) Get(ctx context.Context, key once.Key) (once.Action, error) {
	var a once.Action
	err := s.queryRow(ctx, stGet, func(r *sql.Rows) error { return scanAction(r, &a) }, string(key))
	if errors.Is(err, sql.ErrNoRows) {
		return a, fmt.Errorf("%w: %s", once.ErrNotFound, key)
	}
	return a, s.wrap(err)
}

// List implements once.Store.
func (s *Store) List(ctx context.Context, f once.Filter) ([]once.Action, error) {
	q, args := s.listQuery(f, false)
	rows, err := s.db.QueryContext(ctx, q, args...)
	return collect(s, rows, err, scanOne)
}

// Count implements once.Store.
func (s *Store) Count(ctx context.Context, f once.Filter) (int64, error) {
	q, args := s.listQuery(f, true)
	var n int64
	err := s.db.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, s.wrap(err)
}

// listQuery is List's statement for f (or Count's), and its arguments.
func (s *Store) listQuery(f once.Filter, count bool) (string, []any) {
	clauseOf := storekit.ListClause
	if count {
		clauseOf = storekit.CountClause
	}
	clause, args := clauseOf(f, storekit.Dialect{
		Placeholder: func(int) string { return "?" },
		Time: func(t time.Time) any {
			// Rows hold whole milliseconds: one at or after Since is at
			// or after Since rounded up to the millisecond.
			since := t.UnixMilli()
			if !t.Equal(t.Truncate(time.Millisecond)) {
				since++
			}
			return since
		},
		Waiting: func(def string) string {
			// SQLite reads a partial index only for a query that has
			// one of its condition's terms as a term of its own: each
			// status in its own select, by the open statuses' index.
			return `rowid IN (SELECT rowid FROM ` + s.names.Table("action") + ` WHERE status = 'released' UNION ALL SELECT rowid FROM ` +
				s.names.Table("action") + ` WHERE status = 'approved') AND updated_at < ` + nowMS + ` - coalesce(redrive_after_ms, ` + def + `)`
		},
		Duration: func(d time.Duration) any { return d.Milliseconds() },
		Now:      nowMS,
	})
	if f.Run != "" {
		// The runs' index holds the rows that have a run id, and SQLite
		// reads a partial index only for a query whose WHERE clause has
		// the index's condition as one of its terms: run_id = ? does
		// not show it.
		clause = strings.Replace(clause, " WHERE ", " WHERE run_id <> '' AND ", 1)
	}
	head := s.q.list
	switch {
	case count:
		head = s.q.count
	case f.Brief:
		head = s.q.listBrief
	}
	return head + clause, args
}

// Migrations returns the schema migrations rendered for this store's
// prefix, for users who run their own migration tool.
func (s *Store) Migrations() ([]once.Migration, error) {
	return storekit.LoadMigrations(migrationFS, "migrations", s.names)
}

// Migrate implements once.Store. It runs in one transaction that begins
// IMMEDIATE, so concurrent migrators, in this process or another, take
// turns on the write lock and the second finds every version recorded by
// the first. SQLite's DDL is transactional: a failed migration leaves
// nothing behind.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.MigrateApplied(ctx)
	return err
}

// MigrateApplied implements once.Migrator: it is Migrate, and returns
// the migrations this call ran, none when another migrator ran them
// first.
func (s *Store) MigrateApplied(ctx context.Context) ([]once.Migration, error) {
	if s.inTx {
		return nil, errors.New("sqlite store: Migrate cannot run inside a caller's transaction")
	}
	ms, err := s.Migrations()
	if err != nil {
		return nil, s.wrap(err)
	}
	var ran []once.Migration
	err = s.inWriteTx(ctx, func(tx *Store) (err error) {
		ran, err = s.apply(ctx, tx.db, ms)
		return err
	})
	s.stmts.migrated()
	if err != nil {
		return nil, s.wrap(err)
	}
	return ran, nil
}

// apply records and runs the migrations tx has not seen, and returns
// those it ran.
func (s *Store) apply(ctx context.Context, tx dbtx, ms []once.Migration) ([]once.Migration, error) {
	return storekit.ApplyMigrations(ctx, storekit.MigrationTx{
		Exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := tx.ExecContext(ctx, sql, args...)
			return err
		},
		Ints: func(ctx context.Context, sql string) ([]int, error) {
			rows, err := tx.QueryContext(ctx, sql)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return storekit.Collect(rows, storekit.ScanInt)
		},
		Table: s.names.Table("migration"),
		Columns: `(
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL DEFAULT (` + nowMS + `)
) STRICT`,
		Placeholder: func(n int) string { return "?" + strconv.Itoa(n) },
		// The driver runs one statement per call.
		OneStatementPerCall: true,
	}, ms)
}

// Poll intervals for a waiter's reads of its row. A read in WAL mode
// takes no lock a writer waits for, so they start short.
const (
	pollMin = 25 * time.Millisecond
	pollMax = 250 * time.Millisecond
)

// Wait implements once.Waiter by reading the row, 25ms after the call
// and then backing off to every 250ms; each read borrows a connection for
// that read only. Bound to a caller's transaction it cannot wait: the
// transaction holds the database's write lock, which the attempt it
// would wait for needs to record its outcome.
func (s *Store) Wait(ctx context.Context, req once.WaitRequest) error {
	if s.inTx {
		return errors.New("sqlite store: cannot wait inside a transaction: it holds the database's write lock, which the attempt in flight needs to record its outcome; wait with Do outside the transaction, or return the job to its queue")
	}
	until := time.NewTimer(time.Until(req.Until))
	defer until.Stop()
	every := pollMin
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closed:
			return fmt.Errorf("%s: closed while waiting; nothing more can be read from it", s)
		case <-until.C:
			return nil
		case <-time.After(every):
		}
		every = min(every*2, pollMax)
		var status string
		var attempt int
		rctx, cancel := context.WithDeadline(ctx, req.Until)
		err := s.queryRow(rctx, stState, func(r *sql.Rows) error { return r.Scan(&status, &attempt) }, string(req.Key))
		cancel()
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if req.Moved(false, "", 0) {
				return nil
			}
		case err != nil:
			// Busy or failing for a moment: read again at the next turn.
		case req.Moved(true, once.Status(status), attempt):
			return nil
		}
	}
}
