package rabbitmq

import (
	"fmt"
	"strings"
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
	if got := fmt.Sprint(q.RetryQueues()); got != "[jobs.retry.quorum.100ms jobs.retry.quorum.200ms jobs.retry.quorum.400ms jobs.retry.quorum.800ms jobs.retry.quorum.1.6s jobs.retry.quorum.3.2s]" {
		t.Fatalf("retry queues %s", got)
	}
	for _, tc := range []struct {
		after time.Duration
		delay time.Duration
		queue string
	}{
		{0, 100 * time.Millisecond, "jobs.retry.quorum.100ms"},
		{-time.Second, 100 * time.Millisecond, "jobs.retry.quorum.100ms"},
		{100 * time.Millisecond, 100 * time.Millisecond, "jobs.retry.quorum.100ms"},
		{100*time.Millisecond + time.Microsecond, 101 * time.Millisecond, "jobs.retry.quorum.200ms"},
		{200 * time.Millisecond, 200 * time.Millisecond, "jobs.retry.quorum.200ms"},
		{201 * time.Millisecond, 201 * time.Millisecond, "jobs.retry.quorum.400ms"},
		{time.Second, time.Second, "jobs.retry.quorum.1.6s"},
		{2 * time.Second, 2 * time.Second, "jobs.retry.quorum.3.2s"},
		{time.Hour, 3 * time.Second, "jobs.retry.quorum.3.2s"}, // cut to MaxRetryDelay
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
	if len(rq) != 13 || rq[0] != "jobs.retry.quorum.1s" || rq[12] != "jobs.retry.quorum.1h8m16s" {
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
			"x-death":             []any{amqp.Table{"queue": "jobs.retry.quorum.1s", "reason": "expired"}},
			"x-first-death-queue": "jobs.retry.quorum.1s", "x-first-death-reason": "expired", "x-first-death-exchange": "",
			"x-last-death-queue": "jobs.retry.quorum.1s", "x-last-death-reason": "expired", "x-last-death-exchange": "",
		},
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 3,
		CorrelationId: "c", ReplyTo: "r", Expiration: "60000", MessageId: "m", Timestamp: ts, Type: "t",
		UserId: "alice", AppId: "a", Body: []byte(`{"id":1}`),
	}
	p := retryCopy(d, 1500*time.Millisecond, false)
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

// Declare refuses a broker whose quorum queues cannot expire a retried
// job, and lets through one that does not say its version.
func TestCheckVersion(t *testing.T) {
	for v, ok := range map[any]bool{
		"3.10.8": true, "3.10.0": true, "3.13.7": true, "4.0.2": true,
		"3.9.29": false, "3.8.0": false, "2.8.7": false,
		"": true, "dev": true, nil: true,
	} {
		err := checkVersion(amqp.Table{"version": v})
		if (err == nil) != ok {
			t.Errorf("version %v: %v, want ok=%v", v, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "3.10") {
			t.Errorf("version %v: the error %q does not name the version needed", v, err)
		}
	}
}
