package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// The idle-connection tests that need a server of their own run a
// throwaway PostgreSQL cluster, on a plain temporary directory, whose
// idle_session_timeout closes the connections the store's pool holds
// idle (pgxpool pings only those idle for over a second), or reach it
// through a proxy that silences the idle connections. They need root
// (to run the server as the postgres user) and PostgreSQL's binaries,
// and skip without. Connections ended by the server (a DBA's
// pg_terminate_backend) are storetest's: Faults.End.

// idleVictim is the application_name of the store's connections.
const idleVictim = "once_idle_victim"

// startIdleCluster makes a cluster in a temporary directory (the socket
// there too) on a free port in 26000-26999, starts it with extraConf
// appended to its configuration, and stops and removes it at t's end.
func startIdleCluster(t *testing.T, extraConf ...string) *fullCluster {
	t.Helper()
	uid, gid := clusterUser(t, "the idle-connection tests")
	dir, err := os.MkdirTemp("", "pgidle-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	c := &fullCluster{t: t, mnt: dir, data: filepath.Join(dir, "data"), roomy: dir, uid: uid, gid: gid, filler: filepath.Join(dir, "filler")}
	args := []string{"-D", c.data, "-U", "postgres", "--auth=trust", "--no-sync", "--encoding=UTF8", "--locale=C"}
	if out, err := c.asPostgres(filepath.Join(pgBin, "initdb"), args...).CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v: %s", err, out)
	}
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
max_connections = 60
fsync = off
dynamic_shared_memory_type = mmap
autovacuum = off
logging_collector = off
`, dir) + strings.Join(extraConf, "\n") + "\n"
	c.configure(conf)
	c.startOnFreePort(portIn(26000, 1000))
	return c
}

// idleStore opens a migrated store on c whose connections are named
// idleVictim, and a client over it.
func idleStore(t *testing.T, c *fullCluster, cfg Config, ocfg once.Config) (*Store, *once.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg.PollOnly = true
	s, err := Open(ctx, c.url()+"&application_name="+idleVictim, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ocfg.Store = s
	cl, err := once.New(ocfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, cl
}

var idleSeq atomic.Int64

func idleIntent(tag string) once.Intent {
	return once.Intent{Run: fmt.Sprintf("idle-%s-%d-%d", tag, time.Now().UnixNano(), idleSeq.Add(1)), Step: 1, Kind: "send_email", Target: "x@example.com"}
}

// holeProxy forwards connections to a server; hole makes every
// connection open then go silent, both ways, with nobody told, as a
// firewall or NAT that forgot an idle connection does, while new
// connections pass.
type holeProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	links  []*holeLink
}

type holeLink struct {
	dead        atomic.Bool
	client, srv net.Conn
}

func startHoleProxy(t *testing.T, target string) *holeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.closeLinks()
	})
	return p
}

// closeLinks closes every connection, both ends.
func (p *holeProxy) closeLinks() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		l.client.Close()
		l.srv.Close()
	}
}

func (p *holeProxy) addr() string { return p.ln.Addr().String() }

func (p *holeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		l := &holeLink{client: c, srv: s}
		p.mu.Lock()
		p.links = append(p.links, l)
		p.mu.Unlock()
		go l.pipe(c, s)
		go l.pipe(s, c)
	}
}

func (l *holeLink) pipe(src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.dead.Load() {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// hole silences every connection open now.
func (p *holeProxy) hole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		l.dead.Store(true)
	}
	return len(p.links)
}

// idleModes are the store's two ways of sending claims and outcomes.
var idleModes = []struct {
	name string
	cfg  Config
}{{"batched", Config{}}, {"unbatched", Config{Unbatched: true}}}

func sent(context.Context, once.Attempt) (string, error) { return "sent", nil }

// replay runs Do for in, whose action is finished: the effect must not
// run, and a result that is not a replay is an error.
func replay(t *testing.T, cl *once.Client, in once.Intent) (once.Result[string], error) {
	t.Helper()
	res, err := once.Do(context.Background(), cl, in, func(context.Context, once.Attempt) (string, error) {
		t.Error("the effect of a finished key ran again")
		return "", nil
	})
	if err == nil && !res.Replayed {
		err = errors.New("not a replay")
	}
	return res, err
}

// TestIdleSessionTimeoutUnderASecondDoClaimsAgain: idle_session_timeout
// set below a second (here 500ms) closes connections pgxpool does not
// ping before it hands them out (only those idle for more than a second
// are), and every Do after a pause between the two goes through, as in
// storetest's IdleConnectionTerminatedDoClaimsAgain (where each failed
// before).
func TestIdleSessionTimeoutUnderASecondDoClaimsAgain(t *testing.T) {
	c := startIdleCluster(t, "idle_session_timeout = '500ms'")
	ctx := context.Background()
	for _, m := range idleModes {
		t.Run(m.name, func(t *testing.T) {
			_, cl := idleStore(t, c, m.cfg, once.Config{})
			const n = 3
			fails := 0
			for range n {
				if _, err := once.Do(ctx, cl, idleIntent("warm"), sent); err != nil {
					t.Logf("warm-up: %v", err) // may itself meet a closed connection
				}
				time.Sleep(800 * time.Millisecond)
				if _, err := once.Do(ctx, cl, idleIntent("new"), sent); err != nil {
					fails++
					if fails == 1 {
						t.Logf("%v", err)
					}
				}
			}
			if fails > 0 {
				t.Errorf("idle_session_timeout=500ms: %d of %d Do after 800ms idle failed; want none", fails, n)
			}
		})
	}
}

// TestIdleSessionTimeoutPastAPingHolds: with idle_session_timeout =
// '1s', a pool left idle past it hands out no closed connection: pgxpool
// pings one idle for more than a second and replaces it when the ping
// fails. New keys and duplicates all go through.
func TestIdleSessionTimeoutPastAPingHolds(t *testing.T) {
	c := startIdleCluster(t, "idle_session_timeout = '1s'")
	ctx := context.Background()
	for _, m := range idleModes {
		t.Run(m.name, func(t *testing.T) {
			_, cl := idleStore(t, c, m.cfg, once.Config{})
			done := idleIntent("done")
			if _, err := once.Do(ctx, cl, done, sent); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				time.Sleep(1300 * time.Millisecond)
				if _, err := once.Do(ctx, cl, idleIntent("new"), sent); err != nil {
					t.Errorf("a new key after the idle timeout: %v", err)
				}
				time.Sleep(1300 * time.Millisecond)
				if res, err := replay(t, cl, done); err != nil {
					t.Errorf("a duplicate after the idle timeout: %+v, %v; want a replay", res, err)
				}
			}
		})
	}
}

// TestIdleBlackholedConnectionClaimsAgain: a firewall or NAT forgets the
// pool's idle connection (its packets go nowhere, nobody is told) while
// new connections get through. The next Do's claim waits on the dead
// connection until ClaimTimeout; the read-back, on a fresh connection,
// finds no row, and the claim is sent again there, and runs the effect.
// Before, once answered ErrInFlight with InTransaction ("is being
// claimed in a transaction that has not committed (DoTx)"): no
// transaction held the key, no row existed, and the caller was told to
// wait for a transaction that did not exist.
func TestIdleBlackholedConnectionClaimsAgain(t *testing.T) {
	c := startIdleCluster(t)
	ctx := context.Background()
	for _, m := range idleModes {
		t.Run(m.name, func(t *testing.T) {
			px := startHoleProxy(t, fmt.Sprintf("127.0.0.1:%d", c.port))
			cfg := m.cfg
			cfg.PollOnly = true
			s, err := Open(ctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", px.addr()), cfg)
			if err != nil {
				t.Fatal(err)
			}
			// Closed before the proxy's cleanup closes the dead links,
			// so it does not wait on them.
			defer s.Close()
			defer px.closeLinks()
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			cl, err := once.New(once.Config{Store: s, ClaimTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := once.Do(ctx, cl, idleIntent("warm"), sent); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			px.hole()
			in := idleIntent("new")
			ran := 0
			_, err = once.Do(ctx, cl, in, func(context.Context, once.Attempt) (string, error) {
				ran++
				return "sent", nil
			})
			k, _, _ := once.KeyOf(in)
			_, gerr := s.Get(ctx, k)
			var held *once.InFlightError
			if errors.As(err, &held) && held.InTransaction && errors.Is(gerr, once.ErrNotFound) {
				t.Errorf("Do = %v\n(InTransaction) with no row, no transaction holding the key and the database answering; "+
					"the claim was lost on a dead idle connection", err)
			} else if err != nil {
				t.Errorf("Do = %v; want the claim sent again on a fresh connection", err)
			}
			if ran > 1 {
				t.Errorf("the effect ran %d times", ran)
			}
		})
	}
}
