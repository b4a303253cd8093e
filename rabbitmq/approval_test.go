package rabbitmq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
	"github.com/oncehq/once/rabbitmq"
)

// approve approves j's action as ada.
func (b *bundle) approve(t *testing.T, j job) {
	t.Helper()
	k, _, err := once.KeyOf(j.intent("send"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Approve(context.Background(), k, once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
}

// handleErr runs b.q.Handle and returns the disposition and what the
// work returned (Handle returns only its own settling error).
func (b *bundle) handleErr(t *testing.T, d amqp.Delivery, w func(context.Context, amqp.Delivery) error) (once.Disposition, error) {
	t.Helper()
	var werr error
	disp := b.handle(t, d, func(ctx context.Context, d amqp.Delivery) error {
		werr = w(ctx, d)
		return werr
	})
	return disp, werr
}

// TestApprovalRetriedUntilApproved: a job awaiting approval, on a kind
// with no Redrive hook, is not run: it goes to a retry queue (not a hot
// requeue, not the dead-letter queue), and comes back. Once a person
// approves it, its next delivery sends it, once; a duplicate replays.
func TestApprovalRetriedUntilApproved(t *testing.T) {
	t.Parallel()
	// The delay (a minute) is cut to MaxRetryDelay, so the job comes
	// back within the test.
	b := setup(t, rabbitmq.Config{DeadLetterQueue: "dlq", MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: 200 * time.Millisecond},
		func(*rabbitmq.Queue) once.Config {
			return once.Config{Kinds: map[string]once.KindPolicy{"send": {Approval: once.ApprovalPolicy{Always: true, Expiry: time.Hour}}}}
		})
	var s sender
	w := work(b.client, "send", s.sends)
	j := job{ID: "order-ap", To: "ada@example.com"}
	b.publish(t, j)
	c := consume(t, b, nil, b.q.Name())
	disp, err := b.handleErr(t, c.next(t, 10*time.Second), w)
	if disp.Action != once.JobRetry || disp.After <= 0 || !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("a job awaiting approval: %s after %v (%v); want a retry with a delay", disp.Action, disp.After, err)
	}
	if n := s.sent.Load(); n != 0 {
		t.Fatalf("sent %d times before anyone approved it", n)
	}
	b.approve(t, j)
	back := c.next(t, 10*time.Second)
	if rabbitmq.Retries(back) != 1 || back.MessageId != j.ID {
		t.Fatalf("delivery %q with %d retries; want the job back from its retry queue", back.MessageId, rabbitmq.Retries(back))
	}
	if disp, err := b.handleErr(t, back, w); disp.Action != once.JobAck || err != nil {
		t.Fatalf("the delivery after approval: %s (%v); want ack", disp.Action, err)
	}
	b.publish(t, j)
	if disp, err := b.handleErr(t, c.next(t, 10*time.Second), w); disp.Action != once.JobAck || err != nil {
		t.Fatalf("a duplicate after the send: %s (%v); want ack", disp.Action, err)
	}
	if n := s.sent.Load(); n != 1 {
		t.Fatalf("sent %d times; want once", n)
	}
	if a := b.status(t, j.intent("send")); a.Status != once.StatusSucceeded || a.Attempt != 2 || a.ResolvedBy != "ada" {
		t.Fatalf("action %s at attempt %d, approved by %q; want succeeded at 2, approved by ada", a.Status, a.Attempt, a.ResolvedBy)
	}
	b.drained(t, nil, c)
}

// TestApprovalDeadLetteredThenRedriven: on a kind with a Redrive hook, a
// job awaiting approval is rejected to the dead-letter queue at once.
// Once approved, the reaper publishes it again after RedriveAfter, and
// that delivery sends it, once.
func TestApprovalDeadLetteredThenRedriven(t *testing.T) {
	t.Parallel()
	build := func(a once.Action) (amqp.Publishing, error) {
		return job{ID: a.Run, To: a.Target}.publishing(), nil
	}
	b := setup(t, rabbitmq.Config{DeadLetterQueue: "dlq"}, func(q *rabbitmq.Queue) once.Config {
		return once.Config{Kinds: map[string]once.KindPolicy{"send": {
			Approval: once.ApprovalPolicy{Always: true}, Redrive: q.Redrive(build), RedriveAfter: 50 * time.Millisecond,
		}}}
	})
	var s sender
	w := work(b.client, "send", s.sends)
	j := job{ID: "order-rd", To: "grace@example.com"}
	b.publish(t, j)
	c := consume(t, b, nil, b.q.Name())
	if disp, err := b.handleErr(t, c.next(t, 10*time.Second), w); disp.Action != once.JobDrop || !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("a job awaiting approval, on a kind that re-drives: %s (%v); want it dead-lettered", disp.Action, err)
	}
	b.approve(t, j)
	reaper, err := once.NewReaper(b.client, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		rep, err := reaper.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if rep.Redriven == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reaper did not re-drive the approved action within 20s (last pass %+v)", rep)
		}
		time.Sleep(20 * time.Millisecond)
	}
	redriven := c.next(t, 10*time.Second)
	if disp, err := b.handleErr(t, redriven, w); disp.Action != once.JobAck || err != nil {
		t.Fatalf("the re-drive: %s (%v); want ack", disp.Action, err)
	}
	if n := s.sent.Load(); n != 1 {
		t.Fatalf("sent %d times; want once", n)
	}
	b.drained(t, map[string]int{b.cfg.DeadLetterQueue: 1}, c)
}

// TestApprovalExpiredDeadLettered: the retries end with the wait. A job
// nobody approved goes round its retry queue while it waits, and is
// dead-lettered on the first delivery after the wait expired, never run.
func TestApprovalExpiredDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{DeadLetterQueue: "dlq", MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: 200 * time.Millisecond},
		func(*rabbitmq.Queue) once.Config {
			return once.Config{Kinds: map[string]once.KindPolicy{"send": {Approval: once.ApprovalPolicy{Always: true, Expiry: time.Second}}}}
		})
	var s sender
	w := work(b.client, "send", s.sends)
	j := job{ID: "order-ex", To: "edsger@example.com"}
	b.publish(t, j)
	c := consume(t, b, nil, b.q.Name())
	rounds := 0
	for {
		disp, err := b.handleErr(t, c.next(t, 10*time.Second), w)
		var aw *once.AwaitingApprovalError
		if !errors.As(err, &aw) {
			t.Fatalf("delivery %d: %s (%v); want the wait for approval", rounds+1, disp.Action, err)
		}
		if disp.Action == once.JobDrop {
			if !aw.Expired {
				t.Fatalf("dropped on delivery %d before the wait expired: %s", rounds+1, disp.Reason)
			}
			break
		}
		if disp.Action != once.JobRetry || aw.Expired {
			t.Fatalf("delivery %d: %s, expired %v; want a retry while the wait lasts", rounds+1, disp.Action, aw.Expired)
		}
		if rounds++; rounds > 100 {
			t.Fatal("still going round after 100 deliveries")
		}
	}
	if n := s.sent.Load(); n != 0 {
		t.Fatalf("sent %d times; nobody approved it", n)
	}
	b.drained(t, map[string]int{b.cfg.DeadLetterQueue: 1}, c)
}
