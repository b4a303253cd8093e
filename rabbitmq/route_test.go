package rabbitmq

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Every delay goes to the shortest band at least as long, so it comes
// back no sooner than it asked and sooner than twice that.
func TestRoute(t *testing.T) {
	q, err := New(Config{Conn: new(amqp.Connection), Queue: "jobs", MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(q.RetryQueues()); got != "[jobs.retry.100ms jobs.retry.200ms jobs.retry.400ms jobs.retry.800ms jobs.retry.1.6s jobs.retry.3.2s]" {
		t.Fatalf("retry queues %s", got)
	}
	for _, tc := range []struct {
		after time.Duration
		delay time.Duration
		queue string
	}{
		{0, 100 * time.Millisecond, "jobs.retry.100ms"},
		{-time.Second, 100 * time.Millisecond, "jobs.retry.100ms"},
		{100 * time.Millisecond, 100 * time.Millisecond, "jobs.retry.100ms"},
		{100*time.Millisecond + time.Microsecond, 101 * time.Millisecond, "jobs.retry.200ms"},
		{200 * time.Millisecond, 200 * time.Millisecond, "jobs.retry.200ms"},
		{201 * time.Millisecond, 201 * time.Millisecond, "jobs.retry.400ms"},
		{time.Second, time.Second, "jobs.retry.1.6s"},
		{2 * time.Second, 2 * time.Second, "jobs.retry.3.2s"},
		{time.Hour, 3 * time.Second, "jobs.retry.3.2s"}, // cut to MaxRetryDelay
	} {
		delay, queue := q.route(tc.after)
		if delay != tc.delay || queue != tc.queue {
			t.Errorf("route(%v) = %v in %s, want %v in %s", tc.after, delay, queue, tc.delay, tc.queue)
		}
	}
}

// Defaults: 1s to an hour, doubling.
func TestDefaultBands(t *testing.T) {
	q, err := New(Config{Conn: new(amqp.Connection), Queue: "jobs"})
	if err != nil {
		t.Fatal(err)
	}
	rq := q.RetryQueues()
	if len(rq) != 13 || rq[0] != "jobs.retry.1s" || rq[12] != "jobs.retry.1h8m16s" {
		t.Errorf("default retry queues %v, want 13 from 1s to 1h8m16s", rq)
	}
}

// The copy keeps the job and its properties, counts one more retry, and
// leaves out what would drop it as a dead-letter cycle, route it to other
// queues, or make the broker refuse it.
func TestRetryCopy(t *testing.T) {
	ts := time.Unix(1700000000, 0)
	d := amqp.Delivery{
		Headers: amqp.Table{
			"tenant": "acme", RetryCountHeader: int32(2), "CC": []any{"other"}, "BCC": []any{"secret"},
			"x-death":             []any{amqp.Table{"queue": "jobs.retry.1s", "reason": "expired"}},
			"x-first-death-queue": "jobs.retry.1s", "x-first-death-reason": "expired", "x-first-death-exchange": "",
			"x-last-death-queue": "jobs.retry.1s", "x-last-death-reason": "expired", "x-last-death-exchange": "",
		},
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 3,
		CorrelationId: "c", ReplyTo: "r", Expiration: "60000", MessageId: "m", Timestamp: ts, Type: "t",
		UserId: "alice", AppId: "a", Body: []byte(`{"id":1}`),
	}
	p := retryCopy(d, 1500*time.Millisecond)
	want := amqp.Publishing{
		Headers:     amqp.Table{"tenant": "acme", RetryCountHeader: int64(3)},
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 3,
		CorrelationId: "c", ReplyTo: "r", Expiration: "1500", MessageId: "m", Timestamp: ts, Type: "t",
		AppId: "a", Body: []byte(`{"id":1}`),
	}
	if fmt.Sprintf("%#v", p) != fmt.Sprintf("%#v", want) {
		t.Errorf("retry copy\n%#v\nwant\n%#v", p, want)
	}
	if err := p.Headers.Validate(); err != nil {
		t.Error(err)
	}
}
