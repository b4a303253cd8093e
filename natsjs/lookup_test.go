package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/natstest"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/natsjs"
)

// privateNATS is a nats-server of the test's own, with JetStream, an
// admin user and a worker user who may not read consumers while deny is
// set; permit reloads its configuration with the worker allowed.
type privateNATS struct {
	url, conf, dir string
	port           int
	cmd            *exec.Cmd
}

func startPrivateNATS(t *testing.T) *privateNATS {
	t.Helper()
	natstest.Require(t)
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server"
	}
	if _, err := os.Stat(bin); err != nil {
		testdb.Unavailable(t, "nats-server is not installed")
	}
	port, err := testdb.FreeLowPort(26000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n := &privateNATS{conf: filepath.Join(dir, "nats.conf"), dir: dir, port: port, url: "nats://127.0.0.1:" + strconv.Itoa(port)}
	n.write(t, true)
	n.cmd = exec.Command(bin, "-c", n.conf)
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.cmd.Process.Kill()
		n.cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the private nats-server never listened on %d", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return n
}

func (n *privateNATS) write(t *testing.T, deny bool) {
	t.Helper()
	perms := ""
	if deny {
		perms = `, permissions: {publish: {deny: ["$JS.API.CONSUMER.INFO.>"]}}`
	}
	conf := fmt.Sprintf(`listen: 127.0.0.1:%d
jetstream: {store_dir: %q}
accounts: {
  APP: {
    jetstream: enabled
    users: [
      {user: admin, password: admin}
      {user: worker, password: worker%s}
    ]
  }
}
`, n.port, filepath.Join(n.dir, "js"), perms)
	if err := os.WriteFile(n.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (n *privateNATS) connect(t *testing.T, user string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(n.url, nats.UserInfo(user, user), nats.Timeout(5*time.Second),
		// The refused lookups are the point; the default handler prints them.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// TestConsumerLookupFailureIsAskedAgain: a worker whose first lookup of
// its consumer fails (here the server refuses it, as a permission
// would; a JetStream API that times out does the same) must not take
// the consumer's MaxDeliver for unlimited, nor keep the failure for its
// life. The first delivery of a job that never got a claim (its database
// is down) is handed back and the error says the limit is unknown; once
// the server answers, the second and last delivery is known as the last
// one: terminated with ErrLastDelivery, not a plain retry JetStream
// would drop without a word.
func TestConsumerLookupFailureIsAskedAgain(t *testing.T) {
	t.Parallel()
	n := startPrivateNATS(t)
	_, admin := n.connect(t, "admin")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "JOBS", Subjects: []string{"jobs.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, wjs := n.connect(t, "worker")
	w, err := natsjs.New(wjs, natsjs.Config{RetryDelay: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	natsjs.SetLookupRetry(w, 0)
	down, downStore := testdb.SQLiteClient(t, once.Config{ClaimTimeout: 200 * time.Millisecond})
	downStore.Close()
	fn := charge(down, &record{}, func(context.Context, once.Attempt) (string, error) {
		t.Error("the effect ran without a database")
		return "", nil
	})
	if _, err := admin.Publish(ctx, "jobs.charge", []byte(`{"id":"order-lk","customer":"cus_lk","amount":3}`)); err != nil {
		t.Fatal(err)
	}

	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	d, err := w.Handle(ctx, msg, fn)
	if d.Action != once.JobRetry || !errors.Is(err, natsjs.ErrDeliveryLimitUnknown) || errors.Is(err, natsjs.ErrLastDelivery) {
		t.Fatalf("delivery 1 with the consumer unreadable: %v (%s), %v; want a retry whose error says MaxDeliver is unknown", d.Action, d.Reason, err)
	}

	// The probe connects before the reload: a connection made while the
	// server reloads its users may be refused (Authorization Violation).
	_, probe := n.connect(t, "worker")
	n.write(t, false)
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		_, err := probe.Consumer(pctx, "JOBS", "worker")
		pcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker still cannot read its consumer after the reload: %v", err)
		}
	}

	msg, err = cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("delivery 2 never came: %v", err)
	}
	d, err = w.Handle(ctx, msg, fn)
	if d.Action != once.JobDrop || !errors.Is(err, natsjs.ErrLastDelivery) {
		t.Fatalf("delivery 2 of 2, the consumer readable again: %v (%s), %v; want it terminated with ErrLastDelivery", d.Action, d.Reason, err)
	}
}
