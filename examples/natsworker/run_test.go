package main_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once/internal/brokertest/natstest"
	"github.com/oncehq/once/natsjs"
)

// run is the example, built and running as a process against the real
// NATS server on a stream of the test's own.
type run struct {
	js     jetstream.JetStream
	stream string
	dbPath string
	cons   jetstream.Consumer
	cmd    *exec.Cmd
	exited chan error
	out    *output
}

// start builds the example and runs it against the SMTP server at
// smtpAddr and the payment API at providerURL; it is killed when the
// test ends, and its output logged if the test failed.
func start(t *testing.T, smtpAddr, providerURL string) *run {
	t.Helper()
	url := natstest.Require(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("building the example needs the go command: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "natsworker")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	_, js := natstest.Connect(t)
	r := &run{js: js, stream: natstest.Stream(t, js, jetstream.StreamConfig{}).CachedInfo().Config.Name, dbPath: filepath.Join(dir, "once.db"), exited: make(chan error, 1), out: &output{}}
	r.cmd = exec.Command(bin, "-redrive-after", "3s") // longer than a retried job's wait
	r.cmd.Env = append(os.Environ(),
		"NATS_URL="+url, "SMTP_ADDR="+smtpAddr, "PROVIDER_URL="+providerURL,
		"ONCE_DB="+r.dbPath, "STREAM="+r.stream)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.exited <- r.cmd.Wait() }()
	t.Cleanup(func() {
		r.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("worker output:\n%s", r.out.String())
		}
	})
	waitFor(t, r.exited, "the worker to create its consumer", func() bool {
		r.cons, err = js.Consumer(context.Background(), r.stream, "natsworker")
		return err == nil
	})
	return r
}

// publish puts an order job on the worker's stream, on the subject of
// its id, where a re-drive finds it again.
func (r *run) publish(t *testing.T, data string) {
	t.Helper()
	var o struct{ ID string }
	if err := json.Unmarshal([]byte(data), &o); err != nil {
		t.Fatal(err)
	}
	if _, err := r.js.Publish(context.Background(), natsjs.JobSubject(r.stream+".orders", o.ID), []byte(data)); err != nil {
		t.Fatal(err)
	}
}

// settled reports whether the consumer has n messages delivered and
// settled.
func (r *run) settled(n int) func() bool {
	return func() bool {
		i, err := r.cons.Info(context.Background())
		return err == nil && i.Delivered.Stream == uint64(n) && i.NumAckPending == 0 && i.NumPending == 0
	}
}
