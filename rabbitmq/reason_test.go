package rabbitmq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/oncehq/once"
	"github.com/oncehq/once/rabbitmq"
)

// A job the work refuses before any action (its body does not decode) is
// dropped with a reason that says so, for the log line beside the
// dead-lettered job: not one that sends the operator looking for a
// rolled-back transaction.
func TestRefusedJobReason(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{DeadLetterQueue: "dlq"}, nil)
	msg := job{ID: "refused", To: "eve"}.publishing()
	msg.Body = []byte("{not json")
	if err := b.q.Publish(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	c := consume(t, b, nil, b.q.Name())
	var s sender
	disp := b.handle(t, c.next(t, 10*time.Second), work(b.client, "send_email", s.sends))
	if disp.Action != once.JobDrop {
		t.Fatalf("%s (%s), want drop", disp.Action, disp.Reason)
	}
	if strings.Contains(disp.Reason, "transaction") || !strings.Contains(disp.Reason, "does not decode") {
		t.Errorf("reason %q; want the work's own error (the job does not decode), and no transaction that never was", disp.Reason)
	}
	b.drained(t, map[string]int{b.cfg.DeadLetterQueue: 1}, c)
}
