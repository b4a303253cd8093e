package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oncehq/once/internal/childproc"
	amqp "github.com/rabbitmq/amqp091-go"
)

// broker is a queue server of the run's own: restarting the machine's
// shared NATS or RabbitMQ would break whoever else uses it, so each run
// starts a private one on a free loopback port, with its data in the
// run's directory, and restarts that one.
type broker interface {
	// URL is where clients connect.
	URL() string
	// Restart stops the server and starts it again on the same port and
	// data, and returns once it takes clients again. With crash, it is
	// killed (SIGKILL, the whole process group); otherwise it is sent
	// SIGTERM and shuts down cleanly, killed only if it takes longer
	// than half a minute.
	Restart(ctx context.Context, crash bool) error
	// Close stops it for good.
	Close() error
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// server is a child process run in a process group of its own, so a
// kill reaches every process it started.
type server struct {
	name string
	exe  string // the program that guards it (see guarded)
	cmd  func() *exec.Cmd
	log  string

	mu   sync.Mutex
	proc *exec.Cmd
	done chan struct{}
}

func (s *server) start() error {
	cmd := guarded(s.exe, s.cmd())
	f, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = f, f
	// The guard's parent-death signal must wait for the harness to
	// die, not for the thread that started it (see childproc).
	exited, err := childproc.Start(cmd)
	if err != nil {
		f.Close()
		return fmt.Errorf("chaos: starting %s: %w", s.name, err)
	}
	done := make(chan struct{})
	go func() {
		<-exited
		f.Close()
		close(done)
	}()
	s.mu.Lock()
	s.proc, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// stop asks the server to shut down cleanly (through its guard, see
// guardMain) and waits for it; after grace it is killed.
func (s *server) stop(grace time.Duration) {
	s.mu.Lock()
	proc, done := s.proc, s.done
	s.mu.Unlock()
	if proc == nil {
		return
	}
	proc.Process.Signal(syscall.SIGUSR1)
	select {
	case <-done:
	case <-time.After(grace):
		s.kill()
	}
}

// kill SIGKILLs the server's process group and waits for its leader.
func (s *server) kill() {
	s.mu.Lock()
	proc, done := s.proc, s.done
	s.mu.Unlock()
	if proc == nil {
		return
	}
	syscall.Kill(-proc.Process.Pid, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// exited reports whether the server's process ended.
func (s *server) exited() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// waitUntil polls ready until it succeeds, the server exits, or the
// deadline passes.
func (s *server) waitUntil(ctx context.Context, within time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		if s.exited() {
			return fmt.Errorf("chaos: %s exited while starting (its log: %s): %w", s.name, s.log, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: %s did not take clients within %v (its log: %s): %w", s.name, within, s.log, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// natsBroker is a private nats-server with JetStream, its store in the
// run's directory.
type natsBroker struct {
	server
	port int
}

func startNATS(ctx context.Context, dir, exe string) (*natsBroker, error) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server"
		if _, serr := os.Stat(bin); serr != nil {
			return nil, errors.New("chaos: --queue nats needs nats-server on the PATH (Debian: apt-get install nats-server): the run restarts a broker of its own, never the shared one")
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	store := filepath.Join(dir, "nats")
	b := &natsBroker{port: port}
	b.server = server{name: "nats-server", exe: exe, log: filepath.Join(dir, "nats-server.log"), cmd: func() *exec.Cmd {
		return exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", store)
	}}
	if err := b.up(ctx); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *natsBroker) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", b.port) }

func (b *natsBroker) up(ctx context.Context) error {
	if err := b.start(); err != nil {
		return err
	}
	return b.waitUntil(ctx, 30*time.Second, func(ctx context.Context) error {
		nc, err := nats.Connect(b.URL(), nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		_, err = js.AccountInfo(ctx)
		return err
	})
}

func (b *natsBroker) Restart(ctx context.Context, crash bool) error {
	if crash {
		b.kill()
	} else {
		b.stop(30 * time.Second)
	}
	return b.up(ctx)
}

func (b *natsBroker) Close() error {
	b.kill()
	return nil
}

// rabbitBroker is a private RabbitMQ node: its own node name, AMQP and
// distribution ports on loopback, data, logs, configuration and Erlang
// cookie in the run's directory, and no plugins.
type rabbitBroker struct {
	server
	port int
}

func startRabbitMQ(ctx context.Context, dir, exe string) (*rabbitBroker, error) {
	bin := "/usr/lib/rabbitmq/bin/rabbitmq-server"
	if _, err := os.Stat(bin); err != nil {
		// The packaged wrapper on the PATH switches to the rabbitmq user
		// when run as root; the script it wraps does not.
		if bin, err = exec.LookPath("rabbitmq-server"); err != nil {
			return nil, errors.New("chaos: --queue rabbitmq needs rabbitmq-server (Debian: apt-get install rabbitmq-server): the run starts and restarts a node of its own, never the shared one")
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dist, err := freePort()
	if err != nil {
		return nil, err
	}
	home := filepath.Join(dir, "rabbitmq")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, err
	}
	files := map[string]string{
		"rabbitmq.conf":     fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\n", port),
		"enabled_plugins":   "[].\n",
		"rabbitmq-env.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(home, name), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	node := fmt.Sprintf("once-chaos-%d-%d@localhost", os.Getpid(), port)
	b := &rabbitBroker{port: port}
	b.server = server{name: "rabbitmq-server (node " + node + ")", exe: exe, log: filepath.Join(dir, "rabbitmq-server.log"), cmd: func() *exec.Cmd {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(),
			"HOME="+home,
			"RABBITMQ_NODENAME="+node,
			"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
			"RABBITMQ_NODE_PORT="+strconv.Itoa(port),
			"RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
			"RABBITMQ_CONF_ENV_FILE="+filepath.Join(home, "rabbitmq-env.conf"),
			"RABBITMQ_CONFIG_FILE="+filepath.Join(home, "rabbitmq"),
			"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(home, "enabled_plugins"),
			"RABBITMQ_MNESIA_BASE="+filepath.Join(home, "mnesia"),
			"RABBITMQ_LOG_BASE="+filepath.Join(home, "log"),
			"RABBITMQ_PID_FILE="+filepath.Join(home, "pid"),
			"ERL_EPMD_ADDRESS=127.0.0.1",
			"ERL_FLAGS=-kernel inet_dist_use_interface {127,0,0,1}",
		)
		return cmd
	}}
	if err := b.up(ctx); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *rabbitBroker) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", b.port) }

func (b *rabbitBroker) up(ctx context.Context) error {
	if err := b.start(); err != nil {
		return err
	}
	return b.waitUntil(ctx, 90*time.Second, func(context.Context) error {
		conn, err := amqp.DialConfig(b.URL(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err != nil {
			return err
		}
		return conn.Close()
	})
}

func (b *rabbitBroker) Restart(ctx context.Context, crash bool) error {
	if crash {
		b.kill()
	} else {
		b.stop(30 * time.Second)
	}
	return b.up(ctx)
}

func (b *rabbitBroker) Close() error {
	b.kill()
	return nil
}
