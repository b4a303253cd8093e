package ha

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Config says where the cluster lives and how its standby replicates.
type Config struct {
	// Dir is the directory in which Start makes the cluster's run
	// directory (once-ha-…), which Close removes. Empty means
	// os.TempDir(). When this process is root, RunAs must be able to
	// reach it (every directory above it searchable by that user), and it
	// must be short enough for a Unix socket path inside it (about 80
	// bytes).
	Dir string
	// Sync makes the standby synchronous: the primary acknowledges a
	// commit only once the standby has flushed it (synchronous_commit on,
	// synchronous_standby_names naming the standby), so a failover loses
	// no acknowledged commit. This is what once's guarantee needs. False
	// (the zero value) makes it asynchronous: commits are acknowledged
	// before the standby has them, and a failover may lose the last ones.
	// The package doc says why that voids the guarantee.
	Sync bool
	// PgAutoctl is the pg_autoctl program. Empty means the one on the
	// PATH, or else /usr/bin/pg_autoctl (Debian's
	// postgresql-15-auto-failover).
	PgAutoctl string
	// BinDir holds PostgreSQL's initdb and pg_ctl. Empty means what
	// `pg_config --bindir` prints, or else the newest
	// /usr/lib/postgresql/*/bin.
	BinDir string
	// RunAs is the user that runs pg_autoctl and PostgreSQL when this
	// process is root (pg_autoctl refuses to run as root). Empty means
	// "postgres". It is ignored when this process is not root: then
	// everything runs as the current user.
	RunAs string
}

// Node is one PostgreSQL server of the cluster, as the monitor names it.
type Node struct {
	// Name is "node1" (the first primary) or "node2" (the first standby).
	Name string
	// Port is where it listens, on 127.0.0.1.
	Port int
}

// URL reaches this node alone, whatever its role: for reading what a
// node has, never for writing through a failover (use Cluster.URL).
func (n Node) URL() string {
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", dbUser, loopback, n.Port, dbName)
}

// Failover is what KillPrimary did and how long the writes stopped.
type Failover struct {
	// Killed is the primary whose process group was killed.
	Killed Node
	// Promoted is the standby that took over: the node the first write
	// after the kill committed on.
	Promoted Node
	// WritesResumed is the time from the kill to the first write that
	// committed through Cluster.URL.
	WritesResumed time.Duration
}

// Cluster is a running monitor and two nodes. Its methods may be called
// from several goroutines; KillPrimary, RestartNode and Close run one at
// a time.
type Cluster struct {
	cfg       Config
	dir       string
	pgautoctl string
	bindir    string
	cred      *syscall.Credential // nil when not root
	env       []string

	monitor *server
	nodes   [2]*server

	mu     sync.Mutex // serializes the operations that change processes
	closed bool
}

// server is one pg_autoctl service and the PostgreSQL it runs.
type server struct {
	name   string
	port   int
	pgdata string
	log    string

	mu   sync.Mutex
	proc *proc
}

// proc is a pg_autoctl process, the leader of its own process group.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it exited
	// killed is set once the group was sent SIGKILL: its id may belong
	// to another group later, so it is not signalled again.
	killed atomic.Bool
}

const (
	loopback  = "127.0.0.1"
	dbUser    = "postgres"
	dbName    = "postgres"
	monitorDB = "pg_auto_failover"

	// Ports are picked below Linux's ephemeral range (32768 and up), so
	// an outgoing connection never holds one, and away from 5432.
	portLow, portHigh = 20000, 32000

	// defaultTimeout bounds an operation whose ctx has no deadline.
	defaultTimeout = 2 * time.Minute
	// pollEvery is how often the monitor or a write is tried again.
	pollEvery = 100 * time.Millisecond
	// stopGrace is how long Close lets pg_autoctl stop its PostgreSQL
	// before it kills the process group.
	stopGrace = 20 * time.Second
)

// monitorSettings make a failover take seconds instead of a minute:
// health checks every second, and a node that fails them (or a primary
// that does not demote itself) given up on after 3 s.
var monitorSettings = [][2]string{
	{"pgautofailover.health_check_period", "1000"},
	{"pgautofailover.health_check_timeout", "1000"},
	{"pgautofailover.health_check_max_retries", "1"},
	{"pgautofailover.health_check_retry_delay", "500"},
	{"pgautofailover.node_considered_unhealthy_timeout", "3000"},
	{"pgautofailover.primary_demote_timeout", "3000"},
}

// tools is what Start needs from the machine.
type tools struct {
	pgautoctl, bindir string
	cred              *syscall.Credential
	user              *user.User
}

// Check tells whether this machine can run a cluster with cfg: pg_autoctl,
// initdb and pg_ctl are installed and, as root, the RunAs user exists.
// The error says what to install. Tests skip on it; Start returns it.
func Check(cfg Config) error {
	_, err := cfg.tools()
	return err
}

func (cfg Config) tools() (tools, error) {
	var t tools
	t.pgautoctl = cfg.PgAutoctl
	if t.pgautoctl == "" {
		if p, err := exec.LookPath("pg_autoctl"); err == nil {
			t.pgautoctl = p
		} else {
			t.pgautoctl = "/usr/bin/pg_autoctl"
		}
	}
	if _, err := os.Stat(t.pgautoctl); err != nil {
		return t, fmt.Errorf("ha: pg_autoctl not found at %s (%v): install Debian's postgresql-15-auto-failover "+
			"(scripts/ha-setup.sh does), or set Config.PgAutoctl", t.pgautoctl, err)
	}
	t.bindir = cfg.BinDir
	if t.bindir == "" {
		t.bindir = findBinDir()
	}
	for _, prog := range []string{"initdb", "pg_ctl"} {
		if _, err := os.Stat(filepath.Join(t.bindir, prog)); err != nil {
			return t, fmt.Errorf("ha: %s not found in %q (%v): install PostgreSQL's server package, or set Config.BinDir", prog, t.bindir, err)
		}
	}
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return t, fmt.Errorf("ha: who is running this: %w", err)
		}
		t.user = u
		return t, nil
	}
	name := cfg.RunAs
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return t, fmt.Errorf("ha: pg_autoctl refuses to run as root, and Config.RunAs user %q does not exist (%v): "+
			"install PostgreSQL's server package, which creates the postgres user, or name another user", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return t, fmt.Errorf("ha: user %q has a uid or gid this package cannot use: %w", name, err)
	}
	if uid == 0 {
		return t, fmt.Errorf("ha: Config.RunAs %q is root, and pg_autoctl refuses to run as root: name another user", name)
	}
	t.user = u
	t.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	return t, nil
}

// findBinDir asks pg_config, then looks where Debian installs PostgreSQL.
func findBinDir() string {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); d != "" {
			return d
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
	if len(dirs) > 0 {
		return dirs[len(dirs)-1]
	}
	return "/usr/lib/postgresql/15/bin"
}

func version(bindir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return n
}

// Start sets up a monitor and two nodes, node1 the primary and node2 its
// standby, and returns once both are in their goal states (as the monitor
// reports them) and the primary replicates as cfg.Sync asks. It takes
// about 10 s on an idle two-core machine, twice that under load. If ctx
// has no deadline, Start gives up after two minutes. On failure it stops
// what it started and removes the run directory; the error ends with the
// last lines of the logs.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	t, err := cfg.tools()
	if err != nil {
		return nil, err
	}
	parent := cfg.Dir
	if parent == "" {
		parent = os.TempDir()
	}
	if fi, err := os.Stat(parent); err != nil {
		return nil, fmt.Errorf("ha: Config.Dir: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("ha: Config.Dir %q is not a directory", parent)
	}
	if t.cred != nil {
		if err := searchable(parent, t.user); err != nil {
			return nil, fmt.Errorf("ha: Config.Dir %q: %w; choose a directory under /tmp, or leave Dir empty", parent, err)
		}
	}
	dir, err := os.MkdirTemp(parent, "once-ha-")
	if err != nil {
		return nil, fmt.Errorf("ha: making the run directory: %w", err)
	}
	dir, _ = filepath.Abs(dir)
	// A Unix socket path holds at most 107 bytes.
	if n := len(filepath.Join(dir, "sock", ".s.PGSQL.00000")); n > 107 {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("ha: Config.Dir %q is too long: a socket path in it would be %d bytes, more than 107; choose a shorter directory", parent, n)
	}
	ports, err := freePorts(3)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &Cluster{cfg: cfg, dir: dir, pgautoctl: t.pgautoctl, bindir: t.bindir, cred: t.cred}
	c.monitor = &server{name: "monitor", port: ports[0], pgdata: filepath.Join(dir, "monitor"), log: filepath.Join(dir, "monitor.log")}
	for i := range c.nodes {
		name := fmt.Sprintf("node%d", i+1)
		c.nodes[i] = &server{name: name, port: ports[i+1], pgdata: filepath.Join(dir, name), log: filepath.Join(dir, name+".log")}
	}
	c.env = []string{
		"PATH=" + t.bindir + ":" + filepath.Dir(t.pgautoctl) + ":/usr/bin:/bin",
		"HOME=" + dir,
		"XDG_CONFIG_HOME=" + filepath.Join(dir, "config"),
		"XDG_DATA_HOME=" + filepath.Join(dir, "data"),
		"XDG_RUNTIME_DIR=" + filepath.Join(dir, "run"),
		"TMPDIR=" + filepath.Join(dir, "tmp"),
		// pg_autoctl reaches its own PostgreSQL over the Unix socket.
		"PGHOST=" + filepath.Join(dir, "sock"),
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if err := c.start(ctx); err != nil {
		err = fmt.Errorf("ha: starting the cluster in %s: %w%s", dir, err, c.logTails())
		c.Close()
		return nil, err
	}
	return c, nil
}

// start is Start's work: the run directory's layout, the data
// directories, the monitor, node1 alone, then node2 as its standby.
func (c *Cluster) start(ctx context.Context) error {
	for _, d := range []string{"config", "data", "run", "tmp", "sock"} {
		if err := os.Mkdir(filepath.Join(c.dir, d), 0o700); err != nil {
			return err
		}
	}
	if err := c.chownAll(); err != nil {
		return err
	}
	// The monitor's and node1's data directories are made here, not by
	// pg_autoctl, to keep their sockets and shared memory in the run
	// directory (node2 copies node1's settings). Both at once: initdb
	// takes a good part of Start's time.
	errs := make(chan error, 2)
	for _, s := range []*server{c.monitor, c.nodes[0]} {
		go func() { errs <- c.initdb(ctx, s) }()
	}
	if err := errors.Join(<-errs, <-errs); err != nil {
		return err
	}

	if err := c.spawn(c.monitor, "create", "monitor",
		"--pgctl", filepath.Join(c.bindir, "pg_ctl"), "--pgdata", c.monitor.pgdata,
		"--pgport", strconv.Itoa(c.monitor.port), "--hostname", loopback, "--listen", loopback,
		"--auth", "trust", "--no-ssl", "--run"); err != nil {
		return err
	}
	if err := c.poll(ctx, "the monitor", []*server{c.monitor}, func(ctx context.Context) (bool, string, error) {
		_, err := c.states(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		return err
	}
	if err := c.tuneMonitor(ctx); err != nil {
		return err
	}

	if err := c.createNode(c.nodes[0]); err != nil {
		return err
	}
	if err := c.poll(ctx, "node1 to run alone (single)", []*server{c.monitor, c.nodes[0]}, func(ctx context.Context) (bool, string, error) {
		st, err := c.states(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return len(st) == 1 && st[0].reported == "single" && st[0].goal == "single", describe(st), nil
	}); err != nil {
		return err
	}
	// node2 is a base backup of node1, which starts with a checkpoint
	// spread over minutes; one made now leaves it nothing to write.
	if err := exec1(ctx, c.nodes[0].node().URL(), "CHECKPOINT"); err != nil {
		return fmt.Errorf("checkpoint on node1: %w", err)
	}
	if err := c.createNode(c.nodes[1]); err != nil {
		return err
	}
	return c.waitHealthy(ctx)
}

// initdb makes a data directory whose sockets and dynamic shared memory
// live in the run directory: nothing is left in /var/run/postgresql or
// /dev/shm, even by a node that was killed.
func (c *Cluster) initdb(ctx context.Context, s *server) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bindir, "initdb"), "-D", s.pgdata, "-U", dbUser,
		"--auth=trust", "--no-sync", "--encoding=UTF8", "--locale=C")
	cmd.Env = c.env
	cmd.Dir = c.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb for %s: %w: %s", s.name, err, strings.TrimSpace(string(out)))
	}
	conf := fmt.Sprintf("\n# lab/chaos/ha: sockets and shared memory stay in the run directory.\n"+
		"unix_socket_directories = '%s'\ndynamic_shared_memory_type = mmap\n", filepath.Join(c.dir, "sock"))
	f, err := os.OpenFile(filepath.Join(s.pgdata, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(conf)
	return errors.Join(err, f.Close())
}

// tuneMonitor applies monitorSettings; the monitor reads them on reload.
func (c *Cluster) tuneMonitor(ctx context.Context) error {
	conn, err := connect(ctx, c.monitorSuperURL())
	if err != nil {
		return fmt.Errorf("tuning the monitor: %w", err)
	}
	defer conn.Close(context.Background())
	for _, s := range monitorSettings {
		if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET %s = %s", s[0], s[1])); err != nil {
			return fmt.Errorf("tuning the monitor: %s: %w", s[0], err)
		}
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("tuning the monitor: %w", err)
	}
	return nil
}

// createNode registers s with the monitor and runs it: the first node
// registered becomes the primary, the second its standby (a base backup
// of the first), synchronous or not as Config.Sync says.
func (c *Cluster) createNode(s *server) error {
	return c.spawn(s, "create", "postgres",
		"--pgctl", filepath.Join(c.bindir, "pg_ctl"), "--pgdata", s.pgdata,
		"--pgport", strconv.Itoa(s.port), "--hostname", loopback, "--listen", loopback,
		"--name", s.name, "--username", dbUser, "--dbname", dbName,
		"--monitor", c.monitorURL(), "--auth", "trust", "--no-ssl",
		"--replication-quorum", strconv.FormatBool(c.cfg.Sync), "--run")
}

// URL reaches the primary, whichever node it is: a multi-host URL with
// target_session_attrs=read-write, so pgx tries both nodes and keeps the
// one that accepts writes. connect_timeout=2 bounds each host's attempt.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://%s@%s:%d,%s:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		dbUser, loopback, c.nodes[0].port, loopback, c.nodes[1].port, dbName)
}

// MonitorURL reaches the monitor's database (pg_auto_failover), where
// pgautofailover.node holds each node's reported and goal state.
func (c *Cluster) MonitorURL() string { return c.monitorSuperURL() }

func (c *Cluster) monitorSuperURL() string {
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", dbUser, loopback, c.monitor.port, monitorDB)
}

// monitorURL is how pg_autoctl on a node reaches the monitor.
func (c *Cluster) monitorURL() string {
	return fmt.Sprintf("postgres://autoctl_node@%s:%d/%s?sslmode=disable", loopback, c.monitor.port, monitorDB)
}

// Nodes returns both nodes, node1 first.
func (c *Cluster) Nodes() []Node { return []Node{c.nodes[0].node(), c.nodes[1].node()} }

// Dir is the run directory: data directories, pg_autoctl's state and
// each process's log (monitor.log, node1.log, node2.log). Close removes
// it.
func (c *Cluster) Dir() string { return c.dir }

func (s *server) node() Node { return Node{Name: s.name, Port: s.port} }

// nodeState is one row of the monitor's pgautofailover.node.
type nodeState struct {
	name           string
	port           int
	reported, goal string
}

func (n nodeState) String() string {
	return fmt.Sprintf("%s %s→%s", n.name, n.reported, n.goal)
}

func describe(st []nodeState) string {
	if len(st) == 0 {
		return "no node registered"
	}
	parts := make([]string, len(st))
	for i, n := range st {
		parts[i] = n.String()
	}
	return strings.Join(parts, ", ")
}

// states asks the monitor for each node's reported and goal state.
func (c *Cluster) states(ctx context.Context) ([]nodeState, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := connect(ctx, c.monitorSuperURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport, reportedstate::text, goalstate::text
		FROM pgautofailover.node WHERE formationid = 'default' ORDER BY nodeid`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (nodeState, error) {
		var n nodeState
		err := r.Scan(&n.name, &n.port, &n.reported, &n.goal)
		return n, err
	})
}

// healthy finds a primary and a secondary both in their goal states.
func healthy(st []nodeState) (primary, secondary nodeState, ok bool) {
	var np, ns int
	for _, n := range st {
		switch {
		case n.reported == "primary" && n.goal == "primary":
			primary = n
			np++
		case n.reported == "secondary" && n.goal == "secondary":
			secondary = n
			ns++
		}
	}
	return primary, secondary, len(st) == 2 && np == 1 && ns == 1
}

// Primary returns the node the monitor has as primary now: in state
// primary, or wait_primary (taking writes while its standby is away).
func (c *Cluster) Primary(ctx context.Context) (Node, error) {
	st, err := c.states(ctx)
	if err != nil {
		return Node{}, fmt.Errorf("ha: asking the monitor: %w", err)
	}
	for _, n := range st {
		if n.reported == n.goal && (n.goal == "primary" || n.goal == "wait_primary" || n.goal == "single") {
			return Node{Name: n.name, Port: n.port}, nil
		}
	}
	return Node{}, fmt.Errorf("ha: no primary now (%s)", describe(st))
}

// WaitHealthy returns once the monitor reports a primary and a secondary
// in their goal states and the primary replicates as Config.Sync asks:
// when the next KillPrimary would fail over. If ctx has no deadline, it
// gives up after two minutes.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if err := c.waitHealthy(ctx); err != nil {
		return fmt.Errorf("ha: %w%s", err, c.logTails())
	}
	return nil
}

func (c *Cluster) waitHealthy(ctx context.Context) error {
	what := "a primary and an asynchronous secondary"
	if c.cfg.Sync {
		what = "a primary and a synchronous secondary"
	}
	return c.poll(ctx, what, nil, func(ctx context.Context) (bool, string, error) {
		st, err := c.states(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		p, _, ok := healthy(st)
		if !ok {
			return false, describe(st), nil
		}
		var commit, names string
		err = queryRow(ctx, Node{Name: p.name, Port: p.port}.URL(),
			"SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')", &commit, &names)
		if err != nil {
			return false, err.Error(), nil
		}
		// pg_autoctl changes synchronous_standby_names with a reload,
		// which the primary may not have read yet.
		isSync := names != "" && (commit == "on" || commit == "remote_apply")
		return isSync == c.cfg.Sync, fmt.Sprintf("%s; %s has synchronous_commit=%s synchronous_standby_names=%q",
			describe(st), p.name, commit, names), nil
	})
}

// KillPrimary kills the primary node's whole process group with SIGKILL
// (pg_autoctl and the PostgreSQL it runs: killing PostgreSQL alone gets
// it restarted in place, with no failover) and returns once a write
// commits through URL, which is on the promoted standby. The cluster
// must be healthy (see WaitHealthy): otherwise there is no standby to
// promote, and KillPrimary says so without killing anything. The killed
// node stays down until RestartNode. If ctx has no deadline, it gives up
// after two minutes; an error after the kill (writes did not resume in
// time) leaves the node killed, and the error ends with the logs.
func (c *Cluster) KillPrimary(ctx context.Context) (Failover, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Failover{}, errors.New("ha: KillPrimary on a closed cluster")
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	st, err := c.states(ctx)
	if err != nil {
		return Failover{}, fmt.Errorf("ha: KillPrimary: asking the monitor: %w", err)
	}
	p, sec, ok := healthy(st)
	if !ok {
		return Failover{}, fmt.Errorf("ha: KillPrimary: no primary with a secondary to promote (%s); "+
			"RestartNode brings a killed node back, WaitHealthy waits for it", describe(st))
	}
	victim, standby := c.server(p.name), c.server(sec.name)
	if victim == nil || standby == nil || !victim.running() {
		return Failover{}, fmt.Errorf("ha: KillPrimary: the monitor's primary %s is not a running node of this cluster", p.name)
	}
	start := time.Now()
	victim.kill()
	var port int
	err = c.poll(ctx, "a write through URL after "+victim.name+" was killed", []*server{c.monitor, standby},
		func(ctx context.Context) (bool, string, error) {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			p, err := c.probeWrite(ctx)
			if err != nil {
				return false, err.Error(), nil
			}
			port = p
			return true, "", nil
		})
	resumed := time.Since(start)
	if err != nil {
		return Failover{}, fmt.Errorf("ha: KillPrimary: %w%s", err, c.logTails())
	}
	f := Failover{Killed: victim.node(), WritesResumed: resumed}
	for _, s := range c.nodes {
		if s.port == port {
			f.Promoted = s.node()
		}
	}
	if f.Promoted != standby.node() {
		return f, fmt.Errorf("ha: KillPrimary: a write after the kill committed on port %d, not on the standby %s", port, standby.name)
	}
	return f, nil
}

// probeWrite commits a write through URL (a temporary table: a read-only
// or standby server refuses it, and it leaves nothing behind) and returns
// the port of the server that took it.
func (c *Cluster) probeWrite(ctx context.Context) (int, error) {
	conn, err := connect(ctx, c.URL())
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TEMPORARY TABLE once_ha_probe (x int) ON COMMIT DROP"); err != nil {
		return 0, err
	}
	var port int
	err = conn.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port)
	return port, err
}

// RestartNode starts a node that KillPrimary killed and returns once it
// has rejoined as the standby of the new primary (pg_autoctl rewinds its
// data directory or copies the primary's afresh) and the cluster is
// healthy again, with how long that took. If ctx has no deadline, it
// gives up after two minutes.
func (c *Cluster) RestartNode(ctx context.Context, name string) (time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errors.New("ha: RestartNode on a closed cluster")
	}
	s := c.server(name)
	if s == nil {
		return 0, fmt.Errorf("ha: RestartNode: no node %q; the nodes are node1 and node2", name)
	}
	if s.running() {
		return 0, fmt.Errorf("ha: RestartNode: %s is running; only a node KillPrimary killed can be restarted", name)
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	start := time.Now()
	if err := c.spawn(s, "run", "--pgdata", s.pgdata); err != nil {
		return 0, fmt.Errorf("ha: RestartNode: %w", err)
	}
	if err := c.waitHealthy(ctx); err != nil {
		return 0, fmt.Errorf("ha: RestartNode %s: %w%s", name, err, c.logTails())
	}
	return time.Since(start), nil
}

func (c *Cluster) server(name string) *server {
	for _, s := range c.nodes {
		if s.name == name {
			return s
		}
	}
	return nil
}

// Close stops the nodes and the monitor (pg_autoctl stops each
// PostgreSQL; a process group still there after 20 s is killed), frees
// the shared memory of any PostgreSQL that was killed, and removes the
// run directory. Calling it again does nothing.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var wg sync.WaitGroup
	for _, s := range []*server{c.nodes[0], c.nodes[1], c.monitor} {
		wg.Go(s.stop)
	}
	wg.Wait()
	var errs []error
	for _, s := range []*server{c.nodes[0], c.nodes[1], c.monitor} {
		errs = append(errs, freeSharedMemory(s.pgdata))
	}
	errs = append(errs, os.RemoveAll(c.dir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ha: Close: %w", err)
	}
	return nil
}

// spawn starts pg_autoctl for s as the leader of a new process group,
// its output appended to s's log.
func (c *Cluster) spawn(s *server, args ...string) error {
	f, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close() // the child has its own descriptor
	cmd := exec.Command(c.pgautoctl, args...)
	cmd.Env = c.env
	cmd.Dir = c.dir
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting pg_autoctl for %s: %w", s.name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

func (s *server) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

func (s *server) running() bool {
	p := s.current()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exited says how s's pg_autoctl ended, if it did.
func (s *server) exited() (string, bool) {
	p := s.current()
	if p == nil {
		return "", false
	}
	select {
	case <-p.done:
		return p.cmd.ProcessState.String(), true
	default:
		return "", false
	}
}

// kill sends SIGKILL to s's process group and waits for its leader.
func (s *server) kill() {
	p := s.current()
	if p == nil {
		return
	}
	p.killGroup()
	<-p.done
}

func (p *proc) killGroup() {
	if p.killed.CompareAndSwap(false, true) {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// stop asks pg_autoctl to stop (it stops its PostgreSQL with a fast
// shutdown), then kills what is left of the process group.
func (s *server) stop() {
	p := s.current()
	if p == nil {
		return
	}
	if p.killed.Load() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
	}
	// Also when the leader exited: a PostgreSQL it left behind is in the
	// group still.
	p.killGroup()
	<-p.done
}

// poll calls try every pollEvery until it reports done, ctx ends, or a
// watched server's pg_autoctl exits. last is what it saw, for the error.
func (c *Cluster) poll(ctx context.Context, what string, watch []*server, try func(context.Context) (done bool, last string, err error)) error {
	var last string
	for {
		done, seen, err := try(ctx)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if seen != "" {
			last = seen
		}
		for _, s := range watch {
			if how, ok := s.exited(); ok {
				return fmt.Errorf("waiting for %s: pg_autoctl for %s exited (%s); last seen: %s", what, s.name, how, last)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w; last seen: %s", what, context.Cause(ctx), last)
		case <-time.After(pollEvery):
		}
	}
}

// logTails is the end of every log, for an error message.
func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, s := range []*server{c.monitor, c.nodes[0], c.nodes[1]} {
		data, err := os.ReadFile(s.log)
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "\n--- %s (last %d lines)\n%s", s.log, len(lines), strings.Join(lines, "\n"))
	}
	return b.String()
}

// chownAll gives the run directory to the RunAs user.
func (c *Cluster) chownAll() error {
	if c.cred == nil {
		return nil
	}
	return filepath.Walk(c.dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(c.cred.Uid), int(c.cred.Gid))
	})
}

// searchable checks that u can reach dir: every directory from the root
// down lets u through.
func searchable(dir string, u *user.User) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	gids, _ := u.GroupIds()
	gids = append(gids, u.Gid)
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok {
			mode := fi.Mode().Perm()
			var bit os.FileMode = 0o001
			switch {
			case strconv.FormatUint(uint64(st.Uid), 10) == u.Uid:
				bit = 0o100
			case slices.Contains(gids, strconv.FormatUint(uint64(st.Gid), 10)):
				bit = 0o010
			}
			if mode&bit == 0 {
				return fmt.Errorf("user %s cannot enter %s (mode %v)", u.Username, d, mode)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// freePorts picks n distinct ports in [portLow, portHigh) that nothing
// listens on now.
func freePorts(n int) ([]int, error) {
	var ports []int
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := portLow + rand.IntN(portHigh-portLow)
		if p == 5432 || slices.Contains(ports, p) {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(loopback, strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("ha: no %d free ports between %d and %d on %s", n, portLow, portHigh, loopback)
	}
	return ports, nil
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultTimeout)
}

func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	// One statement per connection: nothing to prepare or cache.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return pgx.ConnectConfig(ctx, cfg)
}

func exec1(ctx context.Context, url, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

func queryRow(ctx context.Context, url, sql string, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql).Scan(dest...)
}
