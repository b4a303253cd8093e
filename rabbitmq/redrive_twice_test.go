package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
	"github.com/oncehq/once/rabbitmq"
)

// TestRepeatedRedriveRunsOnce: RabbitMQ does not deduplicate by message
// id, so a re-drive of one release published twice (the reaper tried
// again after a failed mark) reaches the queue twice. The claim absorbs
// the copy: the first delivery runs the effect, the second replays its
// result, and both are acked.
func TestRepeatedRedriveRunsOnce(t *testing.T) {
	t.Parallel()
	build := func(a once.Action) (amqp.Publishing, error) {
		return job{ID: a.Run, To: a.Target}.publishing(), nil
	}
	b := setup(t, rabbitmq.Config{MinRetryDelay: time.Minute, MaxRetryDelay: time.Minute}, nil)
	j := job{ID: "order-78", To: "cus_78"}
	var s sender
	calls := 0
	w := work(b.client, "charge", func(ctx context.Context, a once.Attempt) (string, error) {
		calls++
		if calls == 1 {
			return "", once.RetryLater(context.DeadlineExceeded)
		}
		return s.sends(ctx, a)
	})
	b.publish(t, j)
	c := consume(t, b, nil, b.q.Name())
	if disp := b.handle(t, c.next(t, 10*time.Second), w); disp.Action != once.JobRetry {
		t.Fatalf("first delivery: %s (%s), want retry", disp.Action, disp.Reason)
	}
	purgeRetryQueues(t, b)
	released := b.status(t, j.intent("charge"))
	if released.Status != once.StatusReleased {
		t.Fatalf("action is %s, want released", released.Status)
	}
	redrive := b.q.Redrive(build)
	for range 2 {
		if err := redrive(context.Background(), released); err != nil {
			t.Fatal(err)
		}
	}
	d1, d2 := c.next(t, 10*time.Second), c.next(t, 10*time.Second)
	if d1.MessageId != d2.MessageId || d1.MessageId != rabbitmq.RedriveMessageID(released) {
		t.Fatalf("re-drives carry ids %q and %q; want both %q", d1.MessageId, d2.MessageId, rabbitmq.RedriveMessageID(released))
	}
	for i, d := range []amqp.Delivery{d1, d2} {
		if disp := b.handle(t, d, w); disp.Action != once.JobAck {
			t.Fatalf("re-drive %d: %s (%s), want ack", i+1, disp.Action, disp.Reason)
		}
	}
	if n := s.sent.Load(); n != 1 {
		t.Fatalf("the effect ran %d times for two copies of one re-drive; want once", n)
	}
	b.drained(t, nil, c)
}
