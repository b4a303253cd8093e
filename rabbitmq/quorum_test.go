package rabbitmq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/rabbitmqtest"
	"github.com/oncehq/once/rabbitmq"
)

// The retry queues are quorum queues that dead-letter at least once, and
// a job retried through them comes back to the work queue after its
// delay. The broker has no AMQP call that shows a queue's arguments, but
// it refuses to declare an existing queue with arguments other than its
// own: declaring each retry queue again with one argument changed
// proves what it was declared with.
func TestRetryQueuesAreQuorum(t *testing.T) {
	t.Parallel()
	const floor = 300 * time.Millisecond
	b := setup(t, rabbitmq.Config{MinRetryDelay: floor, MaxRetryDelay: 600 * time.Millisecond}, nil)
	conn := rabbitmqtest.Dial(t)
	redeclare := func(name string, args amqp.Table) error {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		_, err = ch.QueueDeclare(name, true, false, false, false, args)
		return err
	}
	want := func() amqp.Table {
		return amqp.Table{
			"x-queue-type":              "quorum",
			"x-dead-letter-strategy":    "at-least-once",
			"x-overflow":                "reject-publish",
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": b.q.Name(),
		}
	}
	rq := b.q.RetryQueues()
	if len(rq) != 2 {
		t.Fatalf("retry queues %v, want 2", rq)
	}
	for _, name := range rq {
		if err := redeclare(name, want()); err != nil {
			t.Fatalf("declaring retry queue %s with quorum, at-least-once arguments: %v", name, err)
		}
		for k, v := range map[string]string{
			"x-queue-type":           "classic",
			"x-dead-letter-strategy": "at-most-once",
			"x-overflow":             "drop-head",
		} {
			args := want()
			args[k] = v
			var ae *amqp.Error
			if err := redeclare(name, args); !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
				t.Errorf("declaring retry queue %s with %s %q: %v; want PRECONDITION_FAILED (it has %s %q)", name, k, v, err, k, want()[k])
			}
		}
	}

	j := job{ID: "quorum-1", To: "cus_q"}
	b.publish(t, j)
	c := consume(t, b, nil, b.q.Name())
	var s sender
	calls := 0
	w := work(b.client, "sync", func(ctx context.Context, a once.Attempt) (string, error) {
		calls++
		if calls == 1 {
			return "", once.RetryLater(errBusy)
		}
		return s.sends(ctx, a)
	})
	first := c.next(t, 10*time.Second)
	// The delay runs from when the broker queued the copy, before Handle
	// returned: measure from before.
	retried := time.Now()
	if disp := b.handle(t, first, w); disp.Action != once.JobRetry {
		t.Fatalf("first delivery: %s (%s), want %s", disp.Action, disp.Reason, once.JobRetry)
	}
	d := c.next(t, 10*time.Second)
	if waited := time.Since(retried); waited < floor-time.Millisecond {
		t.Errorf("the retried job came back %v after the retry, before its delay of %v", waited, floor)
	}
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) == 0 {
		t.Fatalf("the retried job has no x-death header: %v", d.Headers)
	}
	if first, _ := deaths[0].(amqp.Table); first["queue"] != rq[0] || first["reason"] != "expired" {
		t.Errorf("the retried job was dead-lettered by %v, want queue %s, reason expired", first, rq[0])
	}
	if disp := b.handle(t, d, w); disp.Action != once.JobAck {
		t.Fatalf("second delivery: %s (%s), want %s", disp.Action, disp.Reason, once.JobAck)
	}
	if n := s.sent.Load(); n != 1 {
		t.Errorf("the effect landed %d times, want once", n)
	}
	b.drained(t, nil, c)
}
