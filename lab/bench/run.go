package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/postgres"
	"github.com/oncehq/once/sqlite"
)

// maxPoolConns caps the shared pool: the server's max_connections is
// usually 100, and other clients need some.
const maxPoolConns = 80

// poolHeadroom is the pool's connections beyond the largest worker count:
// the measuring queries, and the prefill, never wait for a worker's.
const poolHeadroom = 8

// warmTimeout bounds the wait for the server to have room for the pool's
// connections.
const warmTimeout = time.Minute

// runner is one run: its pool, schema, stores and SQLite files.
type runner struct {
	opts   Options
	tag    string
	schema string
	pool   *pgxpool.Pool
	server string
	// noFlush is set when the server has no pg_stat_force_next_flush
	// (before PostgreSQL 15): commit counts are then taken as the
	// server last published them.
	noFlush bool
	// walStats is pg_walinspect's pg_get_wal_stats, qualified, or ""
	// when the run cannot read the WAL back (walStatsNote says why):
	// see fpi.go.
	walStats, walStatsNote string
	// commitOverhead is what counting commits adds to the count: the
	// measuring queries' own transactions (see calibrate).
	commitOverhead int64

	// log is where the arms run; with Scale it is filled, and empty
	// is where their twins run (EmptySuffix), nil without Scale.
	log, empty *site

	dir         string
	sqliteStore *sqlite.Store
	sqliteDo    *once.Client
	// sqliteDoUnbatched is sqlite_do_unbatched's client, over a store
	// of its own file with group commit off.
	sqliteDoUnbatched *once.Client
	sqliteRaw         *sqliteRaw
	// sqliteProtocol is the protocol's URL over sqliteDo, for
	// sqlite_protocol.
	sqliteProtocol string

	// token is the workers' bearer token of the run's protocol
	// servers, http the client the protocol arms send through (see
	// protocol.go); nil without a protocol arm.
	token string
	http  *http.Client

	// serial numbers the workers, so each runs intents of its own.
	serial atomic.Int64

	closers []func()
}

// A site is one schema: the raw table, once's tables, the stores and
// clients over them, and the finished rows its replay arms read.
type site struct {
	schema string
	sql    statements
	// The two stores of the Do arms share the schema's tables.
	doStore, doUnbatchedStore *postgres.Store
	do, doUnbatched           *once.Client
	// protocol is the URL of the protocol served over do, for the
	// protocol arms; empty without one.
	protocol string
	// replayKeys are the raw table's finished keys replay_raw reads;
	// replayRun and replaySteps the finished intents replay_do runs.
	replayKeys  []string
	replayRun   string
	replaySteps []int64
}

func (s *site) ident() string { return pgx.Identifier{s.schema}.Sanitize() }

// replayIntent is replay_do's i-th intent, one the fill or the prefill
// ran to success.
func (s *site) replayIntent(i int) once.Intent {
	return once.Intent{Run: s.replayRun, Step: s.replaySteps[i], Kind: benchKind, Target: benchTarget, Payload: payload}
}

// siteOf returns where arm runs and the arm it is, without EmptySuffix.
func (r *runner) siteOf(arm string) (*site, string) {
	if base, empty := onEmptyLog(arm); empty && r.empty != nil {
		return r.empty, base
	}
	return r.log, arm
}

func (r *runner) defer_(f func()) { r.closers = append(r.closers, f) }

func (r *runner) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

// Run measures the arms o names, side by side, and returns the report.
// Options are checked before anything runs. The run's schema and SQLite
// directory are removed at the end, unless o.Keep, also when it fails.
func Run(ctx context.Context, o Options) (*Report, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	var b [4]byte
	rand.Read(b[:])
	r := &runner{opts: o, tag: hex.EncodeToString(b[:])}
	r.schema = "once_bench_" + r.tag
	defer r.close()
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	samples, err := r.measureAll(ctx)
	if err != nil {
		return nil, err
	}
	rep := summarize(o, samples)
	rep.Server = r.server
	rep.Note = r.walStatsNote
	if o.Keep {
		rep.Schema, rep.Dir = r.schema, r.dir
		if r.empty != nil {
			rep.EmptySchema = r.empty.schema
		}
	}
	return rep, nil
}

func (r *runner) progress(p Progress) {
	if r.opts.Progress != nil {
		p.Rounds = r.opts.Rounds
		r.opts.Progress(p)
	}
}

func (r *runner) setupNote(note string) { r.progress(Progress{Phase: "setup", Note: note}) }

// setUp opens the pool, makes the schema and its tables, the stores and
// the SQLite files, and fills what the arms read.
func (r *runner) setUp(ctx context.Context) error {
	r.setupNote("connecting")
	pc, err := pgxpool.ParseConfig(r.opts.DB)
	if err != nil {
		return fmt.Errorf("the database URL: %v", dburl.Redact(err.Error()))
	}
	pc.MaxConns = 2
	if r.hasPostgresArm() {
		pc.MaxConns = int32(min(maxWorkers(r.opts.Workers)+poolHeadroom, maxPoolConns))
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "once-bench-" + r.tag
	if r.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return err
	}
	r.defer_(r.pool.Close)
	if err := warm(ctx, r.pool); err != nil {
		return fmt.Errorf("cannot open %d connections to PostgreSQL at %s: %w", pc.MaxConns, pc.ConnConfig.Host, err)
	}
	if err := r.pool.QueryRow(ctx, `SELECT 'PostgreSQL ' || current_setting('server_version')`).Scan(&r.server); err != nil {
		return err
	}
	if r.log, err = r.newSite(ctx, r.schema); err != nil {
		return err
	}
	if r.hasPostgresArm() {
		r.findWALInspect(ctx)
	}
	if r.opts.Scale > 0 {
		if r.empty, err = r.newSite(ctx, r.schema+EmptySuffix); err != nil {
			return err
		}
	}
	if r.hasSQLiteArm() {
		if err := r.openSQLite(ctx); err != nil {
			return err
		}
	}
	// The filled log's replays read rows of the fill; an empty log's,
	// rows written for them.
	fresh := r.log
	if r.opts.Scale > 0 {
		if err := r.fillScale(ctx, r.log); err != nil {
			return err
		}
		fresh = r.empty
	}
	if r.has(ArmReplayRaw) {
		r.setupNote(fmt.Sprintf("%d finished keys for replay_raw", r.opts.ReplayKeys))
		if err := r.prefillReplayRaw(ctx, fresh); err != nil {
			return fmt.Errorf("filling replay_raw's keys: %w", err)
		}
	}
	if r.has(ArmReplayDo) || r.has(ArmReplayProtocol) {
		r.setupNote(fmt.Sprintf("%d finished actions for replay_do and replay_protocol", r.opts.ReplayKeys))
		if err := r.prefillReplayDo(ctx, fresh); err != nil {
			return fmt.Errorf("filling replay_do's actions: %w", err)
		}
	}
	// Hint bits set and statistics fresh, so no arm pays for what the
	// fill left behind.
	r.setupNote("vacuum")
	for _, s := range []*site{r.log, r.empty} {
		if s == nil {
			continue
		}
		if _, err := r.pool.Exec(ctx, s.sql.vacuum); err != nil {
			return fmt.Errorf("vacuuming the tables of %s: %w", s.schema, err)
		}
	}
	return r.calibrate(ctx)
}

// calibrate measures what counting commits adds to the count, by
// counting around nothing a few times and keeping the least: another
// client's commits can only add to it.
func (r *runner) calibrate(ctx context.Context) error {
	r.setupNote("calibrating the commit count")
	least := int64(-1)
	for range 3 {
		before, err := r.counters(ctx, "")
		if err != nil {
			return err
		}
		after, err := r.counters(ctx, "")
		if err != nil {
			return err
		}
		if d := after.commits - before.commits; least < 0 || d < least {
			least = d
		}
	}
	r.commitOverhead = least
	return nil
}

// newSite makes a schema, dropped when the run ends (unless Keep), with
// the raw table and once's tables, and the stores and clients over them.
func (r *runner) newSite(ctx context.Context, schema string) (*site, error) {
	s := &site{schema: schema, sql: newStatements(schema)}
	r.defer_(func() { r.dropSchema(s) })
	if _, err := r.pool.Exec(ctx, `CREATE SCHEMA `+s.ident()); err != nil {
		return nil, fmt.Errorf("creating the run's schema %s: %w", schema, err)
	}
	if _, err := r.pool.Exec(ctx, s.sql.createRaw); err != nil {
		return nil, fmt.Errorf("creating the raw table: %w", err)
	}
	var err error
	if s.doStore, err = newOnceStore(r.pool, schema, true); err != nil {
		return nil, err
	}
	r.defer_(func() { s.doStore.Close() })
	if s.doUnbatchedStore, err = newOnceStore(r.pool, schema, false); err != nil {
		return nil, err
	}
	r.defer_(func() { s.doUnbatchedStore.Close() })
	if err := s.doStore.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("migrating the schema %s: %w", schema, err)
	}
	if s.do, err = once.New(once.Config{Store: s.doStore}); err != nil {
		return nil, err
	}
	if s.doUnbatched, err = once.New(once.Config{Store: s.doUnbatchedStore}); err != nil {
		return nil, err
	}
	if r.has(ArmProtocol) || r.has(ArmReplayProtocol) {
		if s.protocol, err = r.serveProtocol(s.do); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// newOnceStore makes the PostgreSQL store the Do arms run on, over the
// run's pool and schema. do_unbatched is the store with group commit off
// (grouped false: postgres.Config.Unbatched), do the store as
// configured by default (grouped true).
func newOnceStore(pool *pgxpool.Pool, schema string, grouped bool) (*postgres.Store, error) {
	return postgres.New(pool, postgres.Config{Schema: schema, Unbatched: !grouped})
}

// dropSchema drops a site's schema unless Keep, also after the run's
// context ended (an interrupted run cleans up too).
func (r *runner) dropSchema(s *site) {
	if r.opts.Keep {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+s.ident()+` CASCADE`)
}

func (r *runner) has(arm string) bool {
	for _, a := range r.opts.Arms {
		if a == arm {
			return true
		}
	}
	return false
}

func (r *runner) hasPostgresArm() bool {
	for _, a := range r.opts.Arms {
		if !isSQLite(a) {
			return true
		}
	}
	return false
}

func (r *runner) hasSQLiteArm() bool {
	for _, a := range r.opts.Arms {
		if isSQLite(a) {
			return true
		}
	}
	return false
}

func maxWorkers(ws []int) int {
	m := 0
	for _, w := range ws {
		m = max(m, w)
	}
	return m
}

// warm opens every connection the pool may hold and puts them back idle,
// so no arm pays for connecting, and waits out a server at its
// connection limit instead of failing a worker halfway.
func warm(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	backoff := 50 * time.Millisecond
	for len(held) < int(pool.Config().MaxConns) {
		c, err := pool.Acquire(ctx)
		if err == nil {
			held = append(held, c)
			continue
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != pgerrcode.TooManyConnections {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (the server stayed at its connection limit; lower --workers or stop other clients)", err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
	return nil
}

// A sample is one arm's run in one round at one worker count.
type sample struct {
	actions int64
	elapsed time.Duration
	lat     []time.Duration
	mallocs uint64
	// pg is false for the SQLite arms, which have no commits or WAL of
	// PostgreSQL's to count.
	pg      bool
	commits int64
	wal     int64
	// fpi is how much of wal was full-page images, when fpiKnown.
	fpi      int64
	fpiKnown bool
}

// samples holds every sample of a run: by arm, by worker count, one per
// round in order.
type samples map[string]map[int][]sample

// measureAll runs every arm at every worker count, Rounds times, the
// arms in an order rotated by one each round.
func (r *runner) measureAll(ctx context.Context) (samples, error) {
	o := r.opts
	all := samples{}
	for _, a := range o.Arms {
		all[a] = map[int][]sample{}
	}
	step, steps := 0, len(o.Workers)*o.Rounds*len(o.Arms)
	for _, w := range o.Workers {
		for round := range o.Rounds {
			for _, a := range rotate(o.Arms, round) {
				r.progress(Progress{Phase: "measure", Step: step, Steps: steps, Workers: w, Round: round + 1, Arm: a})
				s, err := r.measure(ctx, a, w)
				if err != nil {
					return nil, fmt.Errorf("arm %s with %d workers: %w", a, w, err)
				}
				all[a][w] = append(all[a][w], s)
				step++
			}
		}
	}
	r.progress(Progress{Phase: "measure", Step: steps, Steps: steps})
	return all, nil
}

// latencyCap is the room each worker's latencies start with, so the
// slices grow (allocate) only a few times in an arm's run.
const latencyCap = 4096

// measure runs arm with workers goroutines for the run's Duration. Each
// goroutine starts actions until the time is up; the arm's time runs
// until the last one ends.
func (r *runner) measure(ctx context.Context, arm string, workers int) (sample, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	works := make([]work, workers)
	lats := make([][]time.Duration, workers)
	counts := make([]int64, workers)
	for i := range works {
		works[i] = r.worker(arm)
		lats[i] = make([]time.Duration, 0, latencyCap)
	}
	s := sample{pg: !isSQLite(arm)}
	// Garbage another arm left is not this arm's to collect.
	runtime.GC()
	var before counters
	if s.pg {
		var err error
		if before, err = r.counters(ctx, ""); err != nil {
			return s, err
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs := ms.Mallocs

	start := time.Now()
	deadline := start.Add(r.opts.Duration)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				t0 := time.Now()
				n, err := works[i](ctx)
				if err != nil {
					cancel(err)
					return
				}
				lats[i] = append(lats[i], time.Since(t0))
				counts[i] += int64(n)
			}
		})
	}
	wg.Wait()
	s.elapsed = time.Since(start)
	runtime.ReadMemStats(&ms)
	s.mallocs = ms.Mallocs - mallocs
	if err := context.Cause(ctx); err != nil {
		return s, err
	}
	for i := range workers {
		s.actions += counts[i]
		s.lat = append(s.lat, lats[i]...)
	}
	if s.pg {
		after, err := r.counters(ctx, before.lsn)
		if err != nil {
			return s, err
		}
		// The measuring queries' own transactions are not the arm's.
		s.commits = max(after.commits-before.commits-r.commitOverhead, 0)
		s.wal = max(after.wal, 0)
		s.fpi, s.fpiKnown = r.fpiBytes(ctx, before.lsn, after.lsn)
	}
	return s, nil
}

// counters is what the server has counted for the whole database (its
// commits) and cluster (its WAL).
type counters struct {
	commits int64
	// lsn is where WAL was inserted up to; wal the bytes since the lsn
	// counters was given.
	lsn string
	wal int64
}

// counters reads the database's commit count and the WAL position.
// PostgreSQL's backends publish their counts at most once a second, and
// one idle for less may hold them for up to ten, so it first has each
// of the pool's connections (all idle between arms) publish them with
// pg_stat_force_next_flush, which takes effect as the call returns.
// WAL is measured at the insert position, which includes WAL not yet
// written out, so an arm's WAL is not left for the next one's.
func (r *runner) counters(ctx context.Context, since string) (counters, error) {
	var c counters
	if !r.noFlush {
		conns := r.pool.AcquireAllIdle(ctx)
		var err error
		for _, conn := range conns {
			if err == nil {
				_, err = conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
			}
			conn.Release()
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == pgerrcode.UndefinedFunction {
			r.noFlush = true
		} else if err != nil {
			return c, fmt.Errorf("asking the server to publish its statistics: %w", err)
		}
	}
	var wal *int64
	err := r.pool.QueryRow(ctx, `
SELECT d.xact_commit, l.lsn::text, pg_wal_lsn_diff(l.lsn, nullif($1, '')::pg_lsn)::bigint
FROM pg_stat_database d, pg_current_wal_insert_lsn() AS l(lsn)
WHERE d.datname = current_database()`, since).Scan(&c.commits, &c.lsn, &wal)
	if err != nil {
		return c, fmt.Errorf("reading the database's commit count and WAL position: %w", err)
	}
	if wal != nil {
		c.wal = *wal
	}
	return c, nil
}
