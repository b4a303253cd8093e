package chaos

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/dburl"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/lab/mailbox"
)

// Options configures a run.
type Options struct {
	// DB is the PostgreSQL server's URL (postgres://…). The run makes a
	// schema of its own there and drops it at the end unless Keep.
	// Required, unless HA is set.
	DB string
	// Queue is QueueNATS or QueueRabbitMQ. Required.
	Queue string
	// Intents is the number of intents, a third of each kind. Zero
	// means 2000.
	Intents int
	// Workers is the number of worker processes. Zero means 4.
	Workers int
	// Concurrency is the jobs each worker runs at once. Zero means 4.
	Concurrency int
	// Seed draws the faults: which intents' effects are followed by a
	// kill or a withheld reply, and when each scheduled fault fires and
	// whom it hits. Zero picks one (the report says which).
	Seed uint64
	// FaultScale multiplies the number of faults (per hundred intents:
	// one random kill, a pause, a terminated connection, a proxy cut or
	// black hole, a planned kill and a planned timeout; a broker restart
	// per thousand). Zero means 1.
	FaultScale float64
	// FaultCounts sets how many faults of a type the run schedules,
	// by the type's name in the report (kill, stop, conn, proxy,
	// provider_timeout, broker, failover), in place of what FaultScale
	// gives that type: a long run asks for hundreds of broker restarts
	// this way. kill counts the random kills (the kills planned right
	// after an effect still follow FaultScale); failover needs HA, and
	// between two failovers the killed node is brought back as the new
	// standby.
	FaultCounts map[string]int
	// Naive runs the seed's broken "check, then send" workers instead
	// of once: the same workload and faults, and duplicates.
	Naive bool
	// SMTP is an outside SMTP server's host:port; empty runs one on
	// loopback (lab/mailbox). Either way the harness counts the
	// messages the server accepted on the wire.
	SMTP string
	// CrashBroker restarts the broker by SIGKILL of its process group,
	// a crash, instead of SIGTERM and a clean shutdown. On RabbitMQ a
	// crash can lose retried jobs (see docs/chaos.md).
	CrashBroker bool
	// HA, if set, starts the database the ledger lives on (DB is then
	// not used) and kills its primary once, half way.
	HA StartFailover
	// Keep keeps the schema and the run's directory (logs) at the end.
	Keep bool
	// Exe is the program started as a worker; it must call WorkerMain
	// when IsWorker. Empty means this program (os.Executable).
	Exe string
	// Lease is every kind's lease. Zero means 2 seconds.
	Lease time.Duration
	// Timeout bounds the whole run. Zero means 10 minutes.
	Timeout time.Duration
	// Progress, if set, is called about four times a second.
	Progress func(Progress)
	// Logger gets the harness's own notes (a fault that failed, a step
	// that is slow). Nil discards them.
	Logger *slog.Logger
}

// effectTimeout bounds each effect's call to a provider; a withheld
// reply is held for twice as long.
const effectTimeout = time.Second

// Run runs the workload under faults, resolves what was surfaced for
// review as an operator would, waits for every intent to converge, and
// checks the invariants. The error is for a run that could not be
// carried out (a server missing, a bad option); a run whose invariants
// failed returns a Report whose OK is false.
func Run(ctx context.Context, opts Options) (rep Report, err error) {
	started := time.Now()
	opts, err = opts.withDefaults()
	if err != nil {
		return Report{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &runner{opts: opts, log: log, count: &counters{}}
	r.id = newRunID()
	r.tag = r.id[len("chaos-"):]
	r.schema = "once_chaos_" + r.tag
	rep = Report{Queue: opts.Queue, Intents: opts.Intents, Naive: opts.Naive, Seed: opts.Seed, Run: r.id, Schema: r.schema, Workers: opts.Workers}
	if r.dir, err = os.MkdirTemp("", "once-chaos-"); err != nil {
		return rep, err
	}
	defer func() {
		// The logs are kept when asked, and when once's invariants
		// failed; the naive workers' failures are expected.
		if !opts.Keep && (rep.OK() || opts.Naive || rep.PerKind == nil) {
			os.RemoveAll(r.dir)
		} else {
			rep.Dir = r.dir
		}
	}()
	defer r.close()
	if err := r.setUp(ctx, &rep); err != nil {
		return rep, err
	}
	if err := r.work(ctx, &rep); err != nil {
		return rep, err
	}
	r.tallyUp(ctx, &rep)
	rep.Total = time.Since(started)
	return rep, nil
}

func (o Options) withDefaults() (Options, error) {
	o.Intents = cmp.Or(o.Intents, 2000)
	o.Workers = cmp.Or(o.Workers, 4)
	o.Concurrency = cmp.Or(o.Concurrency, 4)
	o.FaultScale = cmp.Or(o.FaultScale, 1)
	o.Lease = cmp.Or(o.Lease, 2*time.Second)
	o.Timeout = cmp.Or(o.Timeout, 10*time.Minute)
	switch {
	case o.Queue != QueueNATS && o.Queue != QueueRabbitMQ:
		return o, fmt.Errorf("chaos: the queue must be %q or %q, not %q", QueueNATS, QueueRabbitMQ, o.Queue)
	case o.Intents < 3 || o.Intents > 1000000:
		return o, fmt.Errorf("chaos: intents must be between 3 and 1000000 (one of each kind at least), not %d", o.Intents)
	case o.Workers < 1 || o.Workers > 64:
		return o, fmt.Errorf("chaos: workers must be between 1 and 64, not %d", o.Workers)
	case o.Concurrency < 1 || o.Concurrency > 64:
		return o, fmt.Errorf("chaos: concurrency must be between 1 and 64, not %d", o.Concurrency)
	case !(o.FaultScale >= 0 && o.FaultScale <= 100): // NaN compares false to both
		return o, fmt.Errorf("chaos: the fault scale must be between 0 and 100, not %v", o.FaultScale)
	case o.Lease < 500*time.Millisecond:
		return o, fmt.Errorf("chaos: the lease must be at least 500ms, not %v", o.Lease)
	case o.Timeout < 0:
		return o, errors.New("chaos: the timeout must not be negative; zero means 10 minutes")
	case o.HA == nil && o.DB == "":
		return o, errors.New("chaos: a PostgreSQL URL is required (--db postgres://user@host:5432/db): the workers are processes of their own, and the faults cut their connections to the server")
	case o.HA == nil && !dburl.IsPostgres(o.DB):
		return o, errors.New("chaos: the database must be PostgreSQL (postgres://user@host:5432/db): the faults terminate its backends and cut its connections; SQLite has neither")
	}
	if fixed, err := parseFaultCounts(o.FaultCounts); err != nil {
		return o, err
	} else if fixed[faultFailover] > 0 && o.HA == nil {
		return o, errors.New("chaos: failovers need the HA cluster (--ha): without it the ledger has no standby to promote")
	}
	if o.SMTP != "" {
		if _, _, err := net.SplitHostPort(o.SMTP); err != nil {
			return o, fmt.Errorf("chaos: the SMTP server %q is not HOST:PORT", o.SMTP)
		}
	}
	if o.Seed == 0 {
		o.Seed = NewSeed()
	}
	if o.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return o, fmt.Errorf("chaos: cannot find this program to start it as a worker: %w", err)
		}
		o.Exe = exe
	}
	return o, nil
}

// NewSeed draws a seed for Options.Seed, never zero.
func NewSeed() uint64 {
	var b [8]byte
	crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

func newRunID() string {
	b := make([]byte, 4)
	crand.Read(b)
	return "chaos-" + hex.EncodeToString(b)
}

// runner holds what one run set up, to close it in reverse.
type runner struct {
	opts   Options
	log    *slog.Logger
	count  *counters
	id     string
	tag    string // the run id's random part
	schema string
	dir    string

	ha     Failover
	rawURL string // the server, no once parameters: for the harness's own connection
	admin  *pgxpool.Pool
	client *once.Client
	store  *dburl.Store
	reaper *once.Reaper

	tally    *tally
	mail     *mailbox.Server
	tap      *smtpTap
	payments *httpServer
	posts    *httpServer

	// surfaced holds the actions the operator found in review, by kind.
	surfaced map[once.Key]string

	broker  broker
	queue   jobQueue
	proxies []*faultproxy.Proxy
	workers []string // by slot: the worker's database URL
	sup     *supervisor

	closers []func()
}

func (r *runner) defer_(f func()) { r.closers = append(r.closers, f) }

func (r *runner) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

// setUp starts everything the workload needs, in the order it is needed.
func (r *runner) setUp(ctx context.Context, rep *Report) error {
	o := r.opts
	base := o.DB
	if o.HA != nil {
		ha, err := o.HA(ctx, filepath.Join(r.dir, "ha"))
		if err != nil {
			return fmt.Errorf("chaos: starting the failover cluster: %w", err)
		}
		r.ha = ha
		r.defer_(func() { ha.Close() })
		base = ha.URL()
	}
	u, err := neturl.Parse(base)
	if err != nil {
		return errors.New("chaos: the database URL does not parse; write it as postgres://user@host:5432/db")
	}
	q := u.Query()
	if q.Has("once_schema") || q.Has("once_prefix") {
		return errors.New("chaos: leave once_schema and once_prefix out of the database URL: each run makes a schema of its own (once_chaos_…) and drops it at the end")
	}
	if !q.Has("connect_timeout") {
		q.Set("connect_timeout", "3")
	}
	u.RawQuery = q.Encode()
	r.rawURL = u.String()
	rep.Database = "PostgreSQL at " + u.Host
	if r.ha != nil {
		rep.Database = "a pg_auto_failover cluster (" + u.Host + ", target_session_attrs=read-write) whose primary is killed half way"
	}

	// The harness's own connection: migrations, the naive table, the
	// terminations, and dropping the schema.
	pc, err := pgxpool.ParseConfig(r.rawURL)
	if err != nil {
		return fmt.Errorf("chaos: the database URL: %w", err)
	}
	pc.MaxConns = 2
	pc.ConnConfig.RuntimeParams["application_name"] = "once-chaos-harness-" + r.tag
	if r.admin, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return err
	}
	r.defer_(r.admin.Close)
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = r.admin.Ping(pctx)
	cancel()
	if err != nil {
		return fmt.Errorf("chaos: cannot reach PostgreSQL (%s): %w", dburl.Redact(base), err)
	}
	r.defer_(r.dropSchema)
	onceURL := withParams(r.rawURL, map[string]string{"once_schema": r.schema, "pool_max_conns": "4"})
	if o.Naive {
		if _, err := r.admin.Exec(ctx, `CREATE SCHEMA `+r.ident()+`; CREATE TABLE `+r.naiveTable()+` (intent int PRIMARY KEY)`); err != nil {
			return fmt.Errorf("chaos: creating the naive workers' table: %w", err)
		}
	} else {
		s, err := dburl.Open(ctx, onceURL)
		if err != nil {
			return err
		}
		r.store = s
		r.defer_(func() { s.Close() })
		if err := s.Migrate(ctx); err != nil {
			return fmt.Errorf("chaos: migrating schema %s: %w", r.schema, err)
		}
	}

	// The providers, in this process: they outlive every worker.
	fixed, _ := parseFaultCounts(o.FaultCounts) // checked by withDefaults
	pl := plans(rand.New(rand.NewPCG(o.Seed, 1)), o.Intents, o.FaultScale, fixed[faultProviderTimeout])
	r.sup = &supervisor{exe: o.Exe, logDir: r.dir}
	r.tally = newTally(o.Intents, pl, r.sup.killPid, r.count.add)
	upstream := o.SMTP
	if upstream == "" {
		if r.mail, err = mailbox.Start(mailbox.Config{}); err != nil {
			return err
		}
		r.defer_(func() { r.mail.Close() })
		upstream = r.mail.Addr()
		rep.SMTP = "the harness's loopback server " + upstream + ", through a tap that counts its 250s"
	} else {
		rep.SMTP = upstream + ", through a tap that counts its 250s"
	}
	hold := 2 * effectTimeout
	if r.tap, err = startSMTPTap(upstream, r.tally, hold, r.tag); err != nil {
		return err
	}
	r.defer_(func() { r.tap.Close() })
	if r.payments, err = serveHTTP(&payments{t: r.tally, hold: hold, byKey: map[string][]byte{}}); err != nil {
		return err
	}
	r.defer_(func() { r.payments.Close() })
	if r.posts, err = serveHTTP(&posts{t: r.tally, hold: hold, byKey: map[string]string{}}); err != nil {
		return err
	}
	r.defer_(func() { r.posts.Close() })

	// The broker and the jobs.
	switch o.Queue {
	case QueueNATS:
		b, err := startNATS(ctx, r.dir, o.Exe)
		if err != nil {
			return err
		}
		r.broker = b
		rep.Broker = "a private nats-server (JetStream, file storage) at " + b.URL() + ", restarted " + restartedBy(o.CrashBroker)
	case QueueRabbitMQ:
		b, err := startRabbitMQ(ctx, r.dir, o.Exe)
		if err != nil {
			return err
		}
		r.broker = b
		rep.Broker = "a private RabbitMQ node at " + strings.Replace(b.URL(), "guest:guest@", "", 1) + ", restarted " + restartedBy(o.CrashBroker)
	}
	r.defer_(func() { r.broker.Close() })
	if o.Queue == QueueNATS {
		q, err := newNATSJobs(ctx, r.broker.URL(), r.id)
		if err != nil {
			return err
		}
		r.queue = q
	} else {
		q, err := newRabbitJobs(ctx, r.broker.URL(), r.id)
		if err != nil {
			return err
		}
		r.queue = q
	}
	r.defer_(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.queue.close(cctx)
	})
	if err := publishAll(ctx, r.queue, o.Intents); err != nil {
		return err
	}

	// The proxies between the workers and the database, one per host.
	workerURL, err := r.proxied(u)
	if err != nil {
		return err
	}
	for slot := range o.Workers {
		app := map[string]string{"application_name": fmt.Sprintf("%s-w%d", r.appName(), slot), "pool_max_conns": strconv.Itoa(o.Concurrency)}
		if o.Naive {
			r.workers = append(r.workers, withParams(workerURL, app))
		} else {
			app["once_schema"] = r.schema
			r.workers = append(r.workers, withParams(workerURL, app))
		}
	}

	// The harness's client: the reaper, with the verifier and the
	// re-drive hook, and the operator.
	if !o.Naive {
		hc := &http.Client{Timeout: effectTimeout}
		c, err := once.New(once.Config{
			Store: r.store,
			Kinds: policies(o.Lease, func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
				return verifyPost(ctx, hc, r.posts.URL(), a)
			}, r.queue.redrive),
			Origin: "chaos-harness-" + r.tag,
			Logger: r.log,
		})
		if err != nil {
			return err
		}
		r.client = c
		if r.reaper, err = once.NewReaper(c, once.ReaperConfig{Interval: 500 * time.Millisecond, Logger: r.log}); err != nil {
			return err
		}
		if err := r.reaper.Start(ctx); err != nil {
			return err
		}
		r.defer_(r.reaper.Stop)
	}
	return nil
}

func restartedBy(crash bool) string {
	if crash {
		return "by SIGKILL (a crash)"
	}
	return "by SIGTERM (a clean shutdown)"
}

// appName is the prefix of the workers' application_name, by which the
// faults find their backends.
func (r *runner) appName() string { return "once-chaos-" + r.tag }

func (r *runner) ident() string { return pgx.Identifier{r.schema}.Sanitize() }

func (r *runner) naiveTable() string { return pgx.Identifier{r.schema, "naive_sent"}.Sanitize() }

func (r *runner) dropSchema() {
	if r.opts.Keep {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := r.admin.Exec(ctx, `DROP SCHEMA IF EXISTS `+r.ident()+` CASCADE`); err != nil {
		r.log.Warn("chaos: dropping the run's schema", "schema", r.schema, "err", err)
	}
}

// proxied is u with each host replaced by a fault proxy in front of it.
func (r *runner) proxied(u *neturl.URL) (string, error) {
	var hosts []string
	for _, h := range strings.Split(u.Host, ",") {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "5432")
		}
		p, err := faultproxy.Start(h)
		if err != nil {
			return "", fmt.Errorf("chaos: starting the fault proxy in front of %s: %w", h, err)
		}
		r.proxies = append(r.proxies, p)
		r.defer_(func() { p.Close() })
		hosts = append(hosts, p.Addr())
	}
	v := *u
	v.Host = strings.Join(hosts, ",")
	return v.String(), nil
}

// withParams is url with query parameters set.
func withParams(raw string, params map[string]string) string {
	u, _ := neturl.Parse(raw)
	q := u.Query()
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// work starts the workers and the faults, waits for the workload to
// settle, stops the faults, and lets the operator resolve what waits for
// a person until every intent converged.
func (r *runner) work(ctx context.Context, rep *Report) error {
	o := r.opts
	r.sup.env = func(slot int) []string {
		cfg := workerConfig{
			Slot: slot, Run: r.id, RunTag: r.tag, Naive: o.Naive, Queue: r.queue.spec(), DB: r.workers[slot],
			SMTP: r.tap.Addr(), Payments: r.payments.URL(), Posts: r.posts.URL(),
			Lease: o.Lease.String(), EffectTimeout: effectTimeout.String(), Concurrency: o.Concurrency,
		}
		if o.Naive {
			cfg.DB, cfg.NaiveDB, cfg.NaiveTable = "", r.workers[slot], r.naiveTable()
		}
		b, _ := json.Marshal(cfg)
		return []string{envWorker + "=" + string(b)}
	}
	r.sup.start(o.Workers)
	stopped := false
	stopWorkers := func() {
		if !stopped {
			stopped = true
			r.sup.stop(3 * time.Second)
			rep.Workers, rep.Starts = o.Workers, r.sup.starts
		}
	}
	defer stopWorkers()

	var settled sync.Mutex
	progress := 0
	current := func() int {
		settled.Lock()
		defer settled.Unlock()
		return progress
	}
	faultCtx, stopFaults := context.WithCancel(ctx)
	inj := &injector{
		sup: r.sup, admin: r.admin, appName: r.appName(), proxies: r.proxies, broker: r.broker, ha: r.ha, count: r.count,
		stopFor: 2 * o.Lease, blackout: 1500 * time.Millisecond, crashBroker: o.CrashBroker,
		logf: func(f string, a ...any) { r.log.Warn(fmt.Sprintf(f, a...)) },
	}
	fixed, _ := parseFaultCounts(o.FaultCounts) // checked by withDefaults
	faults := schedule(rand.New(rand.NewPCG(o.Seed, 2)), o.Intents, o.Workers, o.FaultScale, r.ha != nil, fixed)
	faultsDone := make(chan struct{})
	faultsDoneAll := faultsDone
	go func() {
		defer close(faultsDone)
		inj.run(faultCtx, faults, current)
	}()

	began := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	report := func(phase string, n, review int) {
		if o.Progress != nil {
			o.Progress(Progress{Phase: phase, Settled: n, Total: o.Intents, Review: review, Faults: r.count.faults()})
		}
	}
	// The workload, under faults.
	faultsOver := false
	for !faultsOver {
		select {
		case <-ctx.Done():
			stopFaults()
			if faultsDone != nil {
				<-faultsDone
			}
			rep.Work = time.Since(began)
			rep.Failures = append(rep.Failures, fmt.Sprintf("the workload did not settle within the run's timeout (%v): %d of %d intents settled", o.Timeout, current(), o.Intents))
			return nil
		case <-faultsDone:
			faultsDone = nil
		case <-tick.C:
		}
		n, review, err := r.settled(ctx)
		if err != nil {
			r.log.Warn("chaos: reading progress", "err", err)
			continue
		}
		settled.Lock()
		progress = n
		settled.Unlock()
		report("work", n, review)
		faultsOver = n >= o.Intents && faultsDone == nil
	}
	stopFaults()
	<-faultsDoneAll
	rep.Work = time.Since(began)

	began = time.Now()
	if !o.Naive {
		if err := r.converge(ctx, rep, report); err != nil {
			return err
		}
	}
	stopWorkers()
	rep.Converge = time.Since(began)
	return nil
}

// settled counts the intents the ledger has settled (succeeded, failed,
// or put up for review), and those in review; for the naive workers, the
// intents in their table.
func (r *runner) settled(ctx context.Context) (n, review int, err error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if r.opts.Naive {
		err = r.admin.QueryRow(qctx, `SELECT count(*) FROM `+r.naiveTable()).Scan(&n)
		return n, 0, err
	}
	stats, err := r.client.Stats(qctx)
	if err != nil {
		return 0, 0, err
	}
	for _, s := range stats {
		switch s.Status {
		case once.StatusSucceeded, once.StatusFailed:
			n += int(s.Count)
		case once.StatusReview:
			n += int(s.Count)
			review += int(s.Count)
		}
	}
	return n, review, nil
}

// converge is the operator step: each action in review is checked
// against its provider's count, as a person would, and resolved done
// when the provider applied it, retry when it did not (the re-drive
// hook then brings its job back). It waits until every intent
// succeeded.
func (r *runner) converge(ctx context.Context, rep *Report, report func(string, int, int)) error {
	o := r.opts
	r.surfaced = map[once.Key]string{}
	for {
		acts, err := r.client.List(ctx, once.Filter{Status: once.StatusReview, Limit: o.Intents})
		if err != nil && ctx.Err() == nil {
			r.log.Warn("chaos: listing review", "err", err)
		}
		var counts map[string][]int
		if len(acts) > 0 {
			counts = r.applied()
		}
		for _, a := range acts {
			r.surfaced[a.Key] = a.Kind
			n := 0
			if c := counts[a.Kind]; a.Step >= 0 && int(a.Step) < len(c) {
				n = c[a.Step]
			}
			res := once.Resolution{By: "chaos operator", Attempt: a.Attempt}
			if n > 0 {
				res.Decision, res.Note = once.DecisionDone, fmt.Sprintf("the provider applied it (%d)", n)
				res.Result, _ = json.Marshal("applied, as the provider's count shows")
				rep.ResolvedDone++
			} else {
				res.Decision, res.Note = once.DecisionRetry, "the provider has no trace of it"
				rep.ResolvedRetry++
			}
			if _, err := r.client.Resolve(ctx, a.Key, res); err != nil {
				r.log.Warn("chaos: resolving", "key", a.Key, "err", err)
				if res.Decision == once.DecisionDone {
					rep.ResolvedDone--
				} else {
					rep.ResolvedRetry--
				}
			}
		}
		stats, err := r.client.Stats(ctx)
		done := 0
		for _, s := range stats {
			if s.Status == once.StatusSucceeded {
				done += int(s.Count)
			}
		}
		if err == nil {
			report("converge", done, len(acts))
			if done >= o.Intents {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			rep.Failures = append(rep.Failures, fmt.Sprintf("the run did not converge within its timeout (%v): %d of %d intents succeeded after the operator step", o.Timeout, done, o.Intents))
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// tallyUp compares what the providers applied with what the ledger
// recorded, per kind, and lists the invariants that failed.
func (r *runner) tallyUp(ctx context.Context, rep *Report) {
	o := r.opts
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	status := map[int]once.Status{}
	if !o.Naive {
		acts, err := r.client.List(ctx, once.Filter{Run: r.id, Limit: o.Intents + 100})
		if err != nil {
			rep.Failures = append(rep.Failures, "cannot read the ledger to compare it with the providers: "+err.Error())
		}
		for _, a := range acts {
			status[int(a.Step)] = a.Status
		}
	}
	recovery := map[string]string{kindEmail: once.AskPerson.String(), kindCharge: once.RetryWithProviderKey.String(), kindPost: once.VerifyThenDecide.String()}
	if o.Naive {
		recovery = map[string]string{kindEmail: "none (naive)", kindCharge: "none (naive)", kindPost: "none (naive)"}
	}
	counts := r.applied()
	if r.mail != nil {
		var off []int
		for i, n := range counts[kindEmail] {
			if tapped := r.tally.count(kindEmail, i); tapped != n {
				off = append(off, i)
			}
		}
		if len(off) > 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("the SMTP tap's count differs from the mailbox's for %d intents (%s); the mailbox's is used", len(off), sample(off, status)))
		}
	}
	per := map[string]Kind{}
	var dup, lost, disagree, unsettled []int
	for i := range o.Intents {
		kind := kindOf(i)
		k := per[kind]
		k.Recovery = recovery[kind]
		k.Intents++
		n := counts[kind][i]
		k.Applied += n
		if n > 1 {
			k.Duplicates += n - 1
			dup = append(dup, i)
		}
		if n == 0 {
			k.Lost++
			lost = append(lost, i)
		}
		if !o.Naive {
			switch st := status[i]; {
			case st == once.StatusSucceeded && n == 1:
				k.Succeeded++
			case st == once.StatusSucceeded:
				k.Succeeded++
				k.Disagree++
				disagree = append(disagree, i)
			default:
				unsettled = append(unsettled, i)
			}
		}
		per[kind] = k
	}
	for _, kind := range r.surfaced {
		k := per[kind]
		k.Review++
		per[kind] = k
	}
	rep.PerKind = per
	for _, k := range per {
		rep.Duplicates += k.Duplicates
		rep.Lost += k.Lost
		rep.Review += k.Review
	}
	rep.Faults = r.count.faults()
	fail := func(what string, intents []int) {
		if len(intents) > 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s: %d intents (%s)", what, len(intents), sample(intents, status)))
		}
	}
	fail("applied more than once", dup)
	fail("never applied (lost)", lost)
	fail("the ledger says succeeded but the provider did not apply it exactly once", disagree)
	fail("not succeeded in the ledger at the end", unsettled)
}

// sample names a few intents, with their kind and ledger status.
func sample(intents []int, status map[int]once.Status) string {
	var parts []string
	for _, i := range intents[:min(len(intents), 8)] {
		p := fmt.Sprintf("#%d %s", i, kindOf(i))
		if st, ok := status[i]; ok {
			p += " " + string(st)
		}
		parts = append(parts, p)
	}
	if len(intents) > 8 {
		parts = append(parts, "…")
	}
	return strings.Join(parts, ", ")
}

// applied returns, per kind and intent, how many times the provider
// applied the effect: the HTTP providers' own counts, and for email the
// harness's mailbox (each intent has its own recipient), or the tap's
// count of 250s when the mail goes to an outside server.
func (r *runner) applied() map[string][]int {
	out := map[string][]int{}
	for _, k := range kinds {
		c := make([]int, r.opts.Intents)
		for i := range c {
			c[i] = r.tally.count(k, i)
		}
		out[k] = c
	}
	if r.mail != nil {
		c := make([]int, r.opts.Intents)
		for _, m := range r.mail.Messages() {
			for _, to := range m.To {
				if i, ok := intentOf(to, r.tag); ok && i < len(c) {
					c[i]++
				}
			}
		}
		out[kindEmail] = c
	}
	return out
}
