package testdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncehq/once/internal/childproc"
)

// PgBouncerOptions configure a private PgBouncer.
type PgBouncerOptions struct {
	// PoolMode is PgBouncer's pool_mode: "transaction" (the default),
	// "session" or "statement".
	PoolMode string
	// PoolSize is default_pool_size, the server connections PgBouncer
	// opens to PostgreSQL for the database. Zero means 8: the server is
	// shared, so it is kept small.
	PoolSize int
	// Upstream is the PostgreSQL PgBouncer forwards to, a postgres://
	// URL: a fault proxy in front of the server, for a test that cuts
	// the link between the pooler and the database. Empty means the
	// test PostgreSQL itself.
	Upstream string
	// MayExit is for a test that makes PgBouncer exit: its exit is not
	// reported as a failure of the test.
	MayExit bool
}

// PgBouncer is a PgBouncer process of the caller's own, in front of
// the test PostgreSQL, listening on loopback.
type PgBouncer struct {
	// URL reaches the upstream database through PgBouncer, as the same
	// user: postgres://user@127.0.0.1:PORT/db?sslmode=disable.
	URL string
	// Addr is PgBouncer's host:port.
	Addr string

	cmd      *exec.Cmd
	done     chan struct{}
	exitedAt time.Time // when done closed
	log      *LockedBuffer

	closeOnce sync.Once
}

// LockedBuffer is a log that one side writes while another reads it: a
// process's output, or a logger's, read by a test. PgBouncer's log is
// one.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// PgBouncerPath finds the pgbouncer binary: on PATH, or where Debian's
// package puts it (/usr/sbin is not on every user's PATH).
func PgBouncerPath() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", errors.New("pgbouncer is not installed; install it with 'apt-get install -y pgbouncer'")
}

// RequirePgBouncer starts a PgBouncer in front of the test PostgreSQL
// for this test, with its configuration in a t.TempDir(), and stops it
// when the test ends. It skips (or, under CI, fails) the test when
// PostgreSQL cannot be reached or pgbouncer is not installed.
func RequirePgBouncer(t testing.TB, opt PgBouncerOptions) *PgBouncer {
	t.Helper()
	upstream := RequirePostgres(t)
	if opt.Upstream != "" {
		upstream = opt.Upstream
	}
	if _, err := PgBouncerPath(); err != nil {
		Unavailable(t, err)
	}
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		// PgBouncer runs as postgres (it refuses root) and must reach
		// its configuration: the directory above the test's own (which
		// StartPgBouncer opens) is made traversable, not readable.
		if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := StartPgBouncer(ctx, dir, upstream, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-b.done:
			if opt.MayExit {
				break
			}
			// Every failure after this moment is a failure to reach
			// it: say why it went, once, with what it logged.
			t.Errorf("PgBouncer at %s exited by itself at %s (%v), with the test still running; its log:\n%s",
				b.Addr, b.exitedAt.Format(time.RFC3339Nano), b.cmd.ProcessState, tail(b.Log(), 4096))
		default:
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// StartPgBouncer starts PgBouncer in front of the PostgreSQL at
// upstream (a postgres:// URL), with its configuration files in dir,
// on a free loopback port below the ephemeral range, and returns once
// it accepts connections. It trusts its clients (auth_type=trust, the
// upstream user the only one it knows) and logs to memory. Run as root,
// it runs as the postgres user: PgBouncer refuses root; dir must then be
// reachable by that user. Close stops it.
func StartPgBouncer(ctx context.Context, dir, upstream string, opt PgBouncerOptions) (*PgBouncer, error) {
	bin, err := PgBouncerPath()
	if err != nil {
		return nil, err
	}
	up, err := pgx.ParseConfig(upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: the upstream URL is not valid: %w", err)
	}
	if opt.PoolMode == "" {
		opt.PoolMode = "transaction"
	}
	if opt.PoolSize == 0 {
		opt.PoolSize = 8
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, errors.New("pgbouncer refuses to run as root, and there is no postgres user to run it as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
	}
	var lastErr error
	for range 5 {
		port, err := FreeLowPort(20000, 5000)
		if err != nil {
			return nil, err
		}
		b, err := startPgBouncer(ctx, bin, dir, up, opt, port, cred)
		if err == nil {
			return b, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "in use") {
			break
		}
	}
	return nil, lastErr
}

// FreeLowPort picks a free loopback port from low to low+n-1: below the
// ephemeral range (32768 and up), so no outgoing connection of another
// test takes it between the check and a server's bind. Callers pick
// ranges clear of the services' own ports and of each other's.
func FreeLowPort(low, n int) (int, error) {
	for range 100 {
		port := low + rand.IntN(n)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ln.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port in %d-%d on 127.0.0.1", low, low+n-1)
}

func startPgBouncer(ctx context.Context, bin, dir string, up *pgx.ConnConfig, opt PgBouncerOptions, port int, cred *syscall.Credential) (*PgBouncer, error) {
	db := fmt.Sprintf("host=%s port=%d dbname=%s", up.Host, up.Port, up.Database)
	if up.Password != "" {
		db += " password=" + up.Password
	}
	ini := fmt.Sprintf(`[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
; the server is shared and may be at its connection limit for a moment:
; the server connections are opened at start and kept, and a refused
; login is tried again soon, not after 15s of refusing every client
min_pool_size = %d
server_login_retry = 0.5
logfile =
pidfile =
`, up.Database, db, port, filepath.Join(dir, "userlist.txt"), opt.PoolMode, opt.PoolSize, opt.PoolSize)
	files := map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  fmt.Sprintf("%q %q\n", up.User, up.Password),
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	log := &LockedBuffer{}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Stdout, cmd.Stderr = log, log
	// It dies with the test process, even one killed by a timeout, and
	// not with the thread that started it (see childproc).
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	exited, err := childproc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	b := &PgBouncer{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		cmd:  cmd,
		done: make(chan struct{}),
		log:  log,
	}
	u := url.URL{Scheme: "postgres", User: url.User(up.User), Host: b.Addr, Path: "/" + up.Database, RawQuery: "sslmode=disable"}
	if up.Password != "" {
		u.User = url.UserPassword(up.User, up.Password)
	}
	b.URL = u.String()
	go func() {
		<-exited
		b.exitedAt = time.Now()
		close(b.done)
	}()
	// Ready when a client gets through to PostgreSQL.
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := pgconn.Connect(cctx, b.URL)
		cancel()
		if err == nil {
			c.Close(ctx)
			return b, nil
		}
		select {
		case <-b.done:
			return nil, fmt.Errorf("pgbouncer exited at start: %s", strings.TrimSpace(log.String()))
		case <-ctx.Done():
			b.Close()
			return nil, fmt.Errorf("pgbouncer at %s did not accept connections (%v): %s", b.Addr, err, strings.TrimSpace(log.String()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close stops PgBouncer and waits for it to exit.
func (b *PgBouncer) Close() error {
	b.closeOnce.Do(func() {
		b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.done:
		case <-time.After(10 * time.Second):
			b.cmd.Process.Kill()
			<-b.done
		}
	})
	return nil
}

// Exited is closed once PgBouncer has exited.
func (b *PgBouncer) Exited() <-chan struct{} { return b.done }

// Log returns what PgBouncer has logged so far.
func (b *PgBouncer) Log() string { return b.log.String() }
