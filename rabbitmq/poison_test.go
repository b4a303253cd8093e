package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/rabbitmq"
)

// handleNoPanic runs Handle and fails the test, rather than dying, when
// Handle lets the work's panic go on.
func handleNoPanic(t *testing.T, q *rabbitmq.Queue, d amqp.Delivery, w func(context.Context, amqp.Delivery) error) (disp once.Disposition, err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Handle panicked with the work's panic %v; want it recovered and the job settled", p)
		}
	}()
	return q.Handle(context.Background(), d, w)
}

// TestPanicIsDeadLetteredAfterBound publishes a poison job, whose work
// panics on every delivery, and a good one behind it. Handle must
// recover each panic (it raised it again, and the poison went round the
// retry queues with no cap), settle the good job, and reject the poison
// to the dead-letter queue at its MaxPanics-th panic, with the panic in
// the reason and its stack in the log.
func TestPanicIsDeadLetteredAfterBound(t *testing.T) {
	t.Parallel()
	logs := &testdb.LockedBuffer{}
	b := setup(t, rabbitmq.Config{DeadLetterQueue: "dlq", MinRetryDelay: 50 * time.Millisecond, MaxRetryDelay: time.Second, MaxPanics: 3,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}, nil)
	b.publish(t, job{ID: "poison", To: "p"}, job{ID: "after", To: "a"})
	c := consume(t, b, nil, b.q.Name())
	var s sender
	w := work(b.client, "send_email", s.sends)
	poisoned := func(ctx context.Context, d amqp.Delivery) error {
		if d.MessageId == "poison" {
			words := strings.Fields("")
			_ = words[0] // out of range: the runtime panics
		}
		return w(ctx, d)
	}
	var panics []once.Disposition
	goodAcked := false
	for len(panics) < 3 || !goodAcked {
		d := c.next(t, 10*time.Second)
		disp, err := handleNoPanic(t, b.q, d, poisoned)
		switch d.MessageId {
		case "after":
			if disp.Action != once.JobAck || err != nil {
				t.Fatalf("the job behind the poison: %s (%v); want ack", disp.Action, err)
			}
			goodAcked = true
		case "poison":
			var pe *rabbitmq.PanicError
			if !errors.As(err, &pe) || !errors.Is(err, rabbitmq.ErrPanicked) || len(pe.Stack) == 0 {
				t.Fatalf("Handle returned %v for the poison; want a *PanicError with its stack", err)
			}
			panics = append(panics, disp)
		}
	}
	for i, disp := range panics {
		want := once.JobRetry
		if i == 2 {
			want = once.JobDrop
		}
		if disp.Action != want {
			t.Errorf("panic %d settled %s (%s); want %s", i+1, disp.Action, disp.Reason, want)
		}
	}
	if r := panics[2].Reason; !strings.Contains(r, "index out of range") || !strings.Contains(r, "MaxPanics") {
		t.Errorf("the poison's reason %q; want the panic and MaxPanics", r)
	}
	if n := s.sent.Load(); n != 1 {
		t.Errorf("sent %d; want 1 (the good job)", n)
	}
	if got := strings.Count(logs.String(), "rabbitmq: the work panicked"); got != 3 || !strings.Contains(logs.String(), "poison_test.go") {
		t.Errorf("%d panics logged, want 3, each with a stack that names the work:\n%s", got, logs)
	}
	b.drained(t, map[string]int{b.cfg.DeadLetterQueue: 1}, c)
	dc := consume(t, b, nil, b.cfg.DeadLetterQueue)
	d := dc.next(t, 10*time.Second)
	if d.MessageId != "poison" || d.Headers[rabbitmq.PanicCountHeader] != int64(2) || deathReason(d) != "rejected" {
		t.Errorf("dead-lettered %q with %s %v (%q); want the poison, rejected after 2 counted panics and the third", d.MessageId, rabbitmq.PanicCountHeader, d.Headers[rabbitmq.PanicCountHeader], deathReason(d))
	}
	d.Ack(false)
}

// TestForgedCountIsRefused publishes jobs whose retry or panic count a
// publisher forged: int64's largest (the next count wrapped negative),
// a negative one, one above 2^31-1, text and a float. Each must be
// rejected to the dead-letter queue without running the work, with an
// error that names the header; before, the work ran.
func TestForgedCountIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{DeadLetterQueue: "dlq"}, nil)
	forged := []amqp.Table{
		{rabbitmq.RetryCountHeader: int64(math.MaxInt64)},
		{rabbitmq.RetryCountHeader: int64(-1)},
		{rabbitmq.RetryCountHeader: int64(math.MaxInt32) + 1},
		{rabbitmq.RetryCountHeader: "many"},
		{rabbitmq.RetryCountHeader: 1.5},
		{rabbitmq.PanicCountHeader: int32(-5)},
	}
	for i, h := range forged {
		p := job{ID: fmt.Sprintf("forged-%d", i), To: "f"}.publishing()
		p.Headers = h
		if err := b.q.Publish(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	c := consume(t, b, nil, b.q.Name())
	var s sender
	for range forged {
		d := c.next(t, 10*time.Second)
		disp, err := handleNoPanic(t, b.q, d, work(b.client, "send_email", s.sends))
		if disp.Action != once.JobDrop || !errors.Is(err, rabbitmq.ErrBadCount) || !strings.Contains(disp.Reason, "header x-once-") {
			t.Errorf("job %s with %v: %s (%s, %v); want dropped unrun, the header named", d.MessageId, d.Headers, disp.Action, disp.Reason, err)
		}
	}
	if n := s.sent.Load(); n != 0 {
		t.Errorf("the work ran %d times; want none", n)
	}
	b.drained(t, map[string]int{b.cfg.DeadLetterQueue: len(forged)}, c)
}

// TestRetriesReadsOnlyCounts reads the retry count of headers of every
// shape: a count this package writes, and the forged ones as -1.
func TestRetriesReadsOnlyCounts(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want int
	}{
		{nil, 0}, {int64(3), 3}, {int32(2), 2}, {uint8(1), 1}, {"7", 7}, {int64(math.MaxInt32), math.MaxInt32},
		{int64(math.MaxInt64), -1}, {int64(-1), -1}, {"x", -1}, {1.0, -1}, {[]byte("1"), -1}, {"99999999999999999999", -1},
	} {
		d := amqp.Delivery{Headers: amqp.Table{}}
		if tc.v != nil {
			d.Headers[rabbitmq.RetryCountHeader] = tc.v
		}
		if got := rabbitmq.Retries(d); got != tc.want {
			t.Errorf("Retries with %T %v = %d; want %d", tc.v, tc.v, got, tc.want)
		}
	}
}
