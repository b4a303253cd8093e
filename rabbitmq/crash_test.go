package rabbitmq_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/rabbitmq"
)

// A RabbitMQ node killed (SIGKILL) right after expired retry copies
// moved back to the work queue loses none of them: the quorum retry
// queues dead-letter at least once, keeping each copy until the work
// queue confirmed it. With classic retry queues, which dead-letter at
// most once and write down lazily what they moved, such a crash lost
// most of the copies in flight.
//
// It runs a private node (its own name, ports, data and logs in a
// temporary directory), never the shared broker, and takes about twenty
// seconds: it is skipped with -short, and where rabbitmq-server is not
// installed (failed under CI=true).
func TestBrokerCrashLosesNoRetriedJob(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills a private RabbitMQ node; skipped with -short")
	}
	t.Parallel()
	node := startPrivateRabbitMQ(t)
	conn, err := amqp.Dial(node.url())
	if err != nil {
		t.Fatal(err)
	}
	q, err := rabbitmq.New(rabbitmq.Config{Conn: conn, Queue: "crash", MinRetryDelay: 200 * time.Millisecond, MaxRetryDelay: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Declare(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A queue declared moments before the node is killed can come back
	// empty, whatever its type: RabbitMQ 3.10 writes down lazily which
	// queues it runs. In a deployment the retry queues were declared
	// long before a crash; a clean restart writes it all down.
	conn.Close()
	node.stop(t)
	node.start(t)
	if conn, err = amqp.Dial(node.url()); err != nil {
		t.Fatal(err)
	}

	// Copies as Handle makes them: persistent, with an expiration of the
	// delay, in the band of the delay, confirmed.
	const n = 2000
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	rq := q.RetryQueues()
	var confirms []*amqp.DeferredConfirmation
	for i := range n {
		// Half in each band, waiting more than half the band's length.
		band, delay := rq[0], 101+i%100
		if i%2 == 1 {
			band, delay = rq[1], 201+i%200
		}
		dc, err := ch.PublishWithDeferredConfirm("", band, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			MessageId:    strconv.Itoa(i),
			Expiration:   strconv.Itoa(delay),
			Body:         []byte("job"),
		})
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, dc)
	}
	for i, dc := range confirms {
		if !dc.Wait() {
			t.Fatalf("the broker nacked copy %d", i)
		}
	}

	// Kill the node as soon as nine in ten copies have moved to the work
	// queue, while the moves of the others are in flight. With classic
	// retry queues the work queue came back from this with almost none
	// of them.
	deadline := time.Now().Add(30 * time.Second)
	for {
		qi, err := ch.QueueDeclarePassive("crash", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if qi.Messages >= n*9/10 {
			t.Logf("killing the node with %d of %d copies in the work queue", qi.Messages, n)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d copies reached the work queue within 30s", qi.Messages, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	node.kill(t)
	conn.Close()
	node.start(t)

	conn, err = amqp.Dial(node.url())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	deadline = time.Now().Add(30 * time.Second)
	for len(seen) < n && time.Now().Before(deadline) {
		d, ok, err := ch.Get("crash", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		seen[d.MessageId] = true
	}
	if len(seen) < n {
		left := 0
		for _, name := range rq {
			qi, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			left += qi.Messages
		}
		t.Errorf("after the crash, %d of %d retried jobs came back to the work queue within 30s (%d still in the retry queues): %d lost", len(seen), n, left, n-len(seen)-left)
	}
}

// privateRabbitMQ is a RabbitMQ node of the test's own, in a process
// group of its own so that a kill reaches the Erlang VM and its helpers.
type privateRabbitMQ struct {
	bin, home, name string
	port, dist      int
	cmd             *exec.Cmd
	done            chan struct{}
}

func (p *privateRabbitMQ) url() string {
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", p.port)
}

func startPrivateRabbitMQ(t *testing.T) *privateRabbitMQ {
	t.Helper()
	// The packaged wrapper on the PATH switches to the rabbitmq user
	// when run as root; the script it wraps does not.
	bin := "/usr/lib/rabbitmq/bin/rabbitmq-server"
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("rabbitmq-server"); err != nil {
			testdb.Unavailable(t, "rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server); this test runs a private node of its own")
		}
	}
	p := &privateRabbitMQ{bin: bin, home: t.TempDir(), port: freePort(t), dist: freePort(t)}
	p.name = fmt.Sprintf("once-test-%d-%d@localhost", os.Getpid(), p.port)
	files := map[string]string{
		"rabbitmq.conf":     fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\n", p.port),
		"enabled_plugins":   "[].\n",
		"rabbitmq-env.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(p.home, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { p.kill(t) })
	p.start(t)
	return p
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// start starts the node (again, on the same data) and waits until it
// takes connections.
func (p *privateRabbitMQ) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(p.bin)
	cmd.Env = append(os.Environ(),
		"HOME="+p.home,
		"RABBITMQ_NODENAME="+p.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(p.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(p.dist),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(p.home, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(p.home, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(p.home, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(p.home, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(p.home, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(p.home, "pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_FLAGS=-kernel inet_dist_use_interface {127,0,0,1}",
	)
	log, err := os.OpenFile(filepath.Join(p.home, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("starting rabbitmq-server: %v", err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		log.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	deadline := time.Now().Add(90 * time.Second)
	for {
		conn, err := amqp.DialConfig(p.url(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			conn.Close()
			return
		}
		select {
		case <-done:
			t.Fatalf("rabbitmq-server exited while starting (its log: %s): %v", log.Name(), err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("rabbitmq-server did not take connections within 90s (its log: %s): %v", log.Name(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop shuts the node down cleanly (SIGTERM) and waits for it.
func (p *privateRabbitMQ) stop(t *testing.T) {
	t.Helper()
	syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("rabbitmq-server (pid %d) did not stop within 60s of SIGTERM", p.cmd.Process.Pid)
	}
	// Whatever of its process group is left (its helpers) goes too.
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd = nil
}

// kill SIGKILLs the node's process group and waits for it.
func (p *privateRabbitMQ) kill(t *testing.T) {
	if p.cmd == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("rabbitmq-server (pid %d) did not end within 10s of SIGKILL", p.cmd.Process.Pid)
	}
	p.cmd = nil
}
