package natsjs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/natsjs"
)

// TestLastDeliveryNotCalledRetry delivers a job to a worker whose database
// is unreachable, on a consumer with MaxDeliver 2: Do fails before any
// claim, so once holds nothing of the job. The first delivery is retried;
// the second is the consumer's last, and JetStream will not deliver it
// again whatever the worker answers. The settlement must not call that a
// retry: the job is lost unless someone publishes it again, and the
// operator has to hear it.
func TestLastDeliveryNotCalledRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{MaxDeliver: 2}, once.Config{})
	down, downStore := testdb.SQLiteClient(t, once.Config{ClaimTimeout: 200 * time.Millisecond})
	downStore.Close()
	w := b.worker(t, natsjs.Config{})
	b.publish(t, job{ID: "order-md", Customer: "cus_md", Amount: 9})
	fn := charge(down, b.log, func(context.Context, once.Attempt) (string, error) {
		t.Error("the effect ran without a database")
		return "", nil
	})
	for n := 1; n <= 2; n++ {
		msg, err := b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("delivery %d never came: %v", n, err)
		}
		d, err := w.Handle(context.Background(), msg, fn)
		if err == nil {
			t.Fatalf("delivery %d: no error from a worker without its database", n)
		}
		last := strings.Contains(d.Reason, "MaxDeliver")
		switch {
		case n == 1 && (d.Action != once.JobRetry || last):
			t.Fatalf("delivery 1 settled %v (%s); want a plain retry", d.Action, d.Reason)
		case n == 2 && (d.Action == once.JobRetry || !last):
			t.Fatalf("the last delivery settled %v (%s); want it not called a retry, and the reason to name MaxDeliver", d.Action, d.Reason)
		}
	}
	if _, err := b.cons.Next(jetstream.FetchMaxWait(2 * time.Second)); err == nil {
		t.Fatal("a third delivery came; the consumer's MaxDeliver is 2")
	}
}

// TestLastDeliveryHandedBack hands a job back unrun (the worker is
// stopping) on its consumer's only delivery: the job is lost, and Handle
// says so, even though it learns the consumer's MaxDeliver only then,
// with its context already ended.
func TestLastDeliveryHandedBack(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{MaxDeliver: 1}, once.Config{})
	b.publish(t, job{ID: "order-hb", Customer: "cus_hb", Amount: 1})
	msg, err := b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	d, err := b.worker(t, natsjs.Config{}).Handle(ctx, msg, func(context.Context, jetstream.Msg) error { ran = true; return nil })
	if ran || d.Action != once.JobDrop || !errors.Is(err, natsjs.ErrLastDelivery) {
		t.Fatalf("ran %v, settled %v (%v); want not run, and reported lost on its last delivery", ran, d.Action, err)
	}
}

// TestMaxDeliverRaisedIsReadAgain: the worker read the consumer's
// MaxDeliver (2) on the first delivery; an operator then raised it to
// 10. The second delivery is not its last: before terminating it as
// such, the worker asks the consumer again, and hands the job back.
func TestMaxDeliverRaisedIsReadAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{MaxDeliver: 2}, once.Config{})
	w := b.worker(t, natsjs.Config{RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 10 * time.Millisecond})
	b.publish(t, job{ID: "order-mr", Customer: "cus_mr", Amount: 4})
	unavailable := func(context.Context, jetstream.Msg) error { return once.ErrUnavailable }
	next := func(n int) jetstream.Msg {
		msg, err := b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("delivery %d never came: %v", n, err)
		}
		return msg
	}
	if d, _ := w.Handle(context.Background(), next(1), unavailable); d.Action != once.JobRetry {
		t.Fatalf("delivery 1: %v (%s); want a retry", d.Action, d.Reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cfg := b.info(t).Config
	cfg.MaxDeliver = 10
	if _, err := b.js.UpdateConsumer(ctx, b.stream, cfg); err != nil {
		t.Fatal(err)
	}
	d, err := w.Handle(context.Background(), next(2), unavailable)
	if d.Action != once.JobRetry || errors.Is(err, natsjs.ErrLastDelivery) {
		t.Fatalf("delivery 2 of 10: %v (%s), %v; want a retry, not a termination as the last", d.Action, d.Reason, err)
	}
}
