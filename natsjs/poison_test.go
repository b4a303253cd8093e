package natsjs_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/natstest"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/natsjs"
)

// TestPanicIsTerminatedAfterBound publishes a poison job, whose job
// function panics on every delivery, then a good one. The worker must
// live through the panics (before, the first one killed the process,
// and the poison killed it again after every restart), settle the good
// job, and terminate the poison on its MaxPanics-th delivery with the
// panic as the reason, logging its stack.
func TestPanicIsTerminatedAfterBound(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{AckWait: 5 * time.Second}, once.Config{})
	logs := &testdb.LockedBuffer{}
	w := b.worker(t, natsjs.Config{MaxPanics: 3, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	run := charge(b.client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		return "ch_ok", nil
	})
	consume(t, w, b.cons, func(ctx context.Context, msg jetstream.Msg) error {
		var j job
		if err := json.Unmarshal(msg.Data(), &j); err == nil && j.ID == "poison" {
			words := strings.Fields("")
			_ = words[0] // out of range: the runtime panics
		}
		return run(ctx, msg)
	})
	b.publish(t, job{ID: "poison", Customer: "cus_p", Amount: 1})
	b.publish(t, job{ID: "order-after", Customer: "cus_a", Amount: 2})

	good := b.log.waitSettle(t, "the job behind the poison settled", func(s settle) bool { return s.seq == 2 })
	if good.d.Action != once.JobAck || good.err != nil {
		t.Fatalf("the job behind the poison settled %v (%v); want ack", good.d.Action, good.err)
	}
	last := b.log.waitSettle(t, "the poison terminated", func(s settle) bool { return s.seq == 1 && s.d.Action == once.JobDrop })
	b.settledAll(t, 2)
	if last.delivered != 3 {
		t.Fatalf("the poison was terminated on delivery %d; want 3 (MaxPanics)", last.delivered)
	}
	var pe *natsjs.PanicError
	if !errors.As(last.err, &pe) || !errors.Is(last.err, natsjs.ErrPanicked) || !strings.Contains(last.d.Reason, "index out of range") || !strings.Contains(last.d.Reason, "MaxPanics") {
		t.Fatalf("the poison's settlement: %q (%v); want a *PanicError, and the panic and MaxPanics in the reason", last.d.Reason, last.err)
	}
	settles, _, _ := b.log.snapshot()
	for _, s := range settles {
		if s.seq == 1 && s.delivered < 3 && s.d.Action != once.JobRetry {
			t.Errorf("the poison's delivery %d settled %v; want retry before the bound", s.delivered, s.d.Action)
		}
	}
	if got := strings.Count(logs.String(), "natsjs: the job function panicked"); got != 3 {
		t.Errorf("%d panics logged; want 3:\n%s", got, logs)
	}
	if !strings.Contains(logs.String(), "poison_test.go") {
		t.Errorf("the log has no stack that names the panicking function:\n%s", logs)
	}
}

// TestConsumeLogNamesJobAndSettlement reads Consume's own line for a
// settled message (no OnSettle): it must name the job (stream and
// sequence, and its Nats-Msg-Id) and the settlement sent to the server,
// where it named only the subject and once's action.
func TestConsumeLogNamesJobAndSettlement(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
	logs := &testdb.LockedBuffer{}
	w, err := natsjs.New(b.js, natsjs.Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	consume(t, w, b.cons, charge(b.client, b.log, func(context.Context, once.Attempt) (string, error) { return "ch_1", nil }))
	data, _ := json.Marshal(job{ID: "order-log", Customer: "cus_l", Amount: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.js.Publish(ctx, b.subject, data, jetstream.WithMsgID("order-log-1")); err != nil {
		t.Fatal(err)
	}
	b.settledAll(t, 1)
	want := `job="` + b.stream + `/1 (Nats-Msg-Id \"order-log-1\")"`
	waitFor(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), "natsjs: job settled") }, "the settlement's log line")
	if line := logs.String(); !strings.Contains(line, want) || !strings.Contains(line, "settled=DoubleAck") {
		t.Fatalf("Consume logged:\n%s\nwant %s and settled=DoubleAck", line, want)
	}
}

// poisonChild consumes the test's stream in a worker process whose job
// function panics on the job "poison" and writes the id of every other
// job to file, until the process is killed.
func poisonChild(file string) error {
	nc, err := nats.Connect(os.Getenv(envNATS))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	cons, err := js.Consumer(ctx, os.Getenv(envStream), "worker")
	if err != nil {
		return err
	}
	w, err := natsjs.New(js, natsjs.Config{RetryDelay: 50 * time.Millisecond})
	if err != nil {
		return err
	}
	return w.Consume(ctx, cons, func(ctx context.Context, msg jetstream.Msg) error {
		var j job
		if err := json.Unmarshal(msg.Data(), &j); err != nil {
			return once.Permanent(err)
		}
		if j.ID == "poison" {
			panic("poison job " + j.ID)
		}
		return appendLine(file, j.ID)
	})
}

// TestPoisonDoesNotKillWorkerProcess runs the worker as a process of
// its own and publishes a poison job and a good one. Before, the first
// panic killed the process (exit status 2), and the poison killed every
// restart in turn; now the process must stay up, run the good job, and
// terminate the poison after MaxPanics deliveries.
func TestPoisonDoesNotKillWorkerProcess(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{AckWait: 5 * time.Second}, once.Config{})
	file := filepath.Join(t.TempDir(), "done")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+file, envPoison+"=1", envNATS+"="+natstest.URL(), envStream+"="+b.stream)
	var stderr testdb.LockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	b.publish(t, job{ID: "poison", Customer: "cus_p", Amount: 1})
	b.publish(t, job{ID: "order-after", Customer: "cus_a", Amount: 2})
	var i *jetstream.ConsumerInfo
	waitFor(t, 20*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatalf("the worker process died (%v):\n%.2000s", waitErr, stderr.String())
		default:
		}
		i = b.info(t)
		return i.Delivered.Stream == 2 && i.NumAckPending == 0 && i.NumPending == 0
	}, "both jobs settled by the worker process")
	if lines := effectLines(t, file); len(lines) != 1 || lines[0] != "order-after" {
		t.Fatalf("the worker process ran %q; want the job behind the poison", lines)
	}
	if i.Delivered.Consumer != natsjs.DefaultMaxPanics+1 {
		t.Fatalf("%d deliveries; want the poison's %d and the good job's one", i.Delivered.Consumer, natsjs.DefaultMaxPanics)
	}
	if !strings.Contains(stderr.String(), "the job function panicked") || !strings.Contains(stderr.String(), "terminated=true") {
		t.Fatalf("the worker process's log has no terminated panic:\n%.2000s", stderr.String())
	}
}

// TestPanicCountsOnlyPanics: a job handed back twice for an ordinary
// reason (the job function returned an error) and then panicking once
// is retried, and runs on its next delivery. JetStream's delivery count
// counts every delivery, so a bound read from it terminated the job on
// its first panic, telling the operator it was poison.
func TestPanicCountsOnlyPanics(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{AckWait: 5 * time.Second}, once.Config{})
	w := b.worker(t, natsjs.Config{MaxPanics: 3, RetryDelay: 50 * time.Millisecond})
	consume(t, w, b.cons, func(ctx context.Context, msg jetstream.Msg) error {
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		switch meta.NumDelivered {
		case 1, 2:
			return errors.New("the database was not reachable")
		case 3:
			panic("a passing fault")
		}
		return nil
	})
	b.publish(t, job{ID: "order-flaky", Customer: "cus_f", Amount: 1})
	third := b.log.waitSettle(t, "the delivery that panicked", func(s settle) bool { return s.delivered == 3 })
	if third.d.Action != once.JobRetry {
		t.Fatalf("a job's first panic, on its delivery 3, settled %v (%q); want retry: it panicked once of MaxPanics 3", third.d.Action, third.d.Reason)
	}
	fourth := b.log.waitSettle(t, "the delivery after the panic", func(s settle) bool { return s.delivered == 4 })
	if fourth.d.Action != once.JobAck {
		t.Fatalf("delivery 4 settled %v (%q); want ack", fourth.d.Action, fourth.d.Reason)
	}
}
