package rabbitmq_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/rabbitmqtest"
	"github.com/oncehq/once/rabbitmq"
)

func TestMain(m *testing.M) {
	// The killed-worker test's worker is this test binary, started again.
	if os.Getenv(envChild) != "" {
		os.Exit(childMain())
	}
	flag.Parse()
	// An Example cannot skip: without a broker (and outside CI, where a
	// missing broker fails every test) the examples are left out, as the
	// tests skip.
	if err := rabbitmqtest.Reachable(); err != nil && os.Getenv("CI") != "true" {
		skip := "^Example"
		if s := flag.Lookup("test.skip").Value.String(); s != "" {
			skip = s + "|" + skip
		}
		flag.Set("test.skip", skip)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// A job delivered twice runs its effect once: the second delivery gets
// the stored result back, and both are acked.
func TestDuplicateDeliveryRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{}, nil)
	var s sender
	j := job{ID: "signup-1", To: "ada@example.com"}
	b.publish(t, j, j)
	c := consume(t, b, nil, b.q.Name())
	var replayed []bool
	w := func(ctx context.Context, d amqp.Delivery) error {
		res, err := once.Do(ctx, b.client, j.intent("send_email"), s.sends)
		replayed = append(replayed, res.Replayed)
		return err
	}
	for i := range 2 {
		if disp := b.handle(t, c.next(t, 10*time.Second), w); disp.Action != once.JobAck {
			t.Fatalf("delivery %d: %s (%s), want ack", i+1, disp.Action, disp.Reason)
		}
	}
	if n := s.sent.Load(); n != 1 {
		t.Errorf("the effect ran %d times for a job delivered twice, want once", n)
	}
	if fmt.Sprint(replayed) != "[false true]" {
		t.Errorf("Replayed per delivery = %v, want [false true]", replayed)
	}
	b.drained(t, nil, c)
}

// A job whose action another attempt holds goes to a retry queue for
// the rest of the holder's lease and comes back after it, not before,
// and not in a loop: it is delivered exactly twice.
func TestInFlightJobWaitsInRetryQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: 10 * time.Second},
		func(*rabbitmq.Queue) once.Config {
			return once.Config{Default: once.KindPolicy{Lease: time.Second}}
		})
	var s sender
	j := job{ID: "signup-2", To: "bob@example.com"}

	// Another worker holds the claim: its effect runs until released.
	started, release := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		_, err := once.Do(context.Background(), b.client, j.intent("send_email"), func(ctx context.Context, a once.Attempt) (string, error) {
			close(started)
			<-release
			return s.sends(ctx, a)
		})
		holder <- err
	}()
	<-started

	b.publish(t, j)
	c := consume(t, b, nil, b.q.Name())
	w := work(b.client, "send_email", s.sends)
	d1 := c.next(t, 10*time.Second)
	handled := time.Now()
	disp := b.handle(t, d1, w)
	if disp.Action != once.JobRetry || disp.After <= 0 {
		t.Fatalf("a job whose claim is held: %s after %v (%s), want retry after the lease", disp.Action, disp.After, disp.Reason)
	}
	close(release)
	if err := <-holder; err != nil {
		t.Fatal(err)
	}

	d2 := c.next(t, disp.After+10*time.Second)
	// The broker counts expirations in whole milliseconds from when it
	// took the copy, which is after handled: it may be up to one
	// millisecond short by this clock, never more.
	if waited := time.Since(handled); waited < disp.After-time.Millisecond {
		t.Errorf("the job came back %v after it was retried, before its delay of %v", waited, disp.After)
	}
	if rabbitmq.Retries(d1) != 0 || rabbitmq.Retries(d2) != 1 {
		t.Errorf("retry counts %d then %d, want 0 then 1", rabbitmq.Retries(d1), rabbitmq.Retries(d2))
	}
	if d2.MessageId != d1.MessageId || string(d2.Body) != string(d1.Body) || d2.ContentType != d1.ContentType {
		t.Errorf("the job came back changed: id %q body %s type %q, was %q %s %q", d2.MessageId, d2.Body, d2.ContentType, d1.MessageId, d1.Body, d1.ContentType)
	}
	if disp := b.handle(t, d2, w); disp.Action != once.JobAck {
		t.Fatalf("the job back from the retry queue: %s (%s), want ack (replayed)", disp.Action, disp.Reason)
	}
	if n := s.sent.Load(); n != 1 {
		t.Errorf("the effect ran %d times, want once", n)
	}
	// Nothing waits anywhere: the two deliveries were all.
	b.drained(t, nil, c)
}

// A retry with no delay (the effect said it did not happen) waits
// MinRetryDelay, every time, instead of coming straight back, and the
// same job goes through the same retry queue more than once.
func TestRetryWithoutDelayWaitsTheFloor(t *testing.T) {
	t.Parallel()
	const floor = 200 * time.Millisecond
	b := setup(t, rabbitmq.Config{MinRetryDelay: floor, MaxRetryDelay: time.Second}, nil)
	j := job{ID: "sync-3", To: "cus_3"}
	b.publish(t, j)
	c := consume(t, b, nil, b.q.Name())

	var s sender
	calls := 0
	effect := func(ctx context.Context, a once.Attempt) (string, error) {
		calls++
		if calls <= 2 {
			return "", once.RetryLater(errBusy)
		}
		return s.sends(ctx, a)
	}
	w := work(b.client, "sync", effect)
	var last time.Time
	for i := range 3 {
		d := c.next(t, 10*time.Second)
		if i > 0 {
			if waited := time.Since(last); waited < floor-time.Millisecond {
				t.Errorf("delivery %d came %v after the retry, before the floor of %v", i+1, waited, floor)
			}
		}
		if got := rabbitmq.Retries(d); got != i {
			t.Errorf("delivery %d has retry count %d, want %d", i+1, got, i)
		}
		last = time.Now()
		disp := b.handle(t, d, w)
		want := once.JobRetry
		if i == 2 {
			want = once.JobAck
		}
		if disp.Action != want {
			t.Fatalf("delivery %d: %s (%s), want %s", i+1, disp.Action, disp.Reason, want)
		}
		if want == once.JobRetry && disp.After != floor {
			t.Errorf("delivery %d was retried after %v, want the floor %v", i+1, disp.After, floor)
		}
	}
	if n := s.sent.Load(); n != 1 {
		t.Errorf("the effect landed %d times, want once", n)
	}
	b.drained(t, nil, c)
}

// A per-message expiration is applied only at the head of a queue: in
// one retry queue, a job that asked for 300ms would wait behind one that
// asked for 3s. The retry queues are banded by delay, so the short one
// comes back first.
func TestShortRetryIsNotHeldBehindLongOne(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: 10 * time.Second}, nil)
	long, short := job{ID: "long", To: "x"}, job{ID: "short", To: "y"}
	b.publish(t, long, short)
	c := consume(t, b, nil, b.q.Name())
	// The work answers as Do does when another attempt holds the claim
	// until the given time.
	holdFor := map[string]time.Duration{"long": 3 * time.Second, "short": 300 * time.Millisecond}
	retried := map[string]bool{}
	w := func(_ context.Context, d amqp.Delivery) error {
		if retried[d.MessageId] {
			return nil
		}
		retried[d.MessageId] = true
		return &once.InFlightError{Attempt: 1, LeaseUntil: time.Now().Add(holdFor[d.MessageId])}
	}
	for range 2 {
		d := c.next(t, 10*time.Second)
		if disp := b.handle(t, d, w); disp.Action != once.JobRetry {
			t.Fatalf("%s: %s, want retry", d.MessageId, disp.Action)
		}
	}
	var order []string
	for range 2 {
		d := c.next(t, 20*time.Second)
		order = append(order, d.MessageId)
		b.handle(t, d, w)
	}
	if fmt.Sprint(order) != "[short long]" {
		t.Errorf("jobs came back in the order %v, want [short long]: the short delay waited behind the long one", order)
	}
	b.drained(t, nil, c)
}

// What Dispose drops is rejected, and lands in the dead-letter queue when
// there is one; a permanent failure is acked (it is recorded), unless
// DeadLetterFailed. Nothing is delivered again.
func TestDroppedJobs(t *testing.T) {
	t.Parallel()
	permanent := func(context.Context, once.Attempt) (string, error) {
		return "", once.Permanent(errors.New("550 no such mailbox"))
	}
	unknown := func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("connection reset after DATA")
	}
	for _, tc := range []struct {
		name       string
		cfg        rabbitmq.Config
		body       []byte // instead of the job
		effect     func(context.Context, once.Attempt) (string, error)
		want       once.JobAction
		wantStatus once.Status
		dead       bool
	}{
		{name: "permanent failure is acked", cfg: rabbitmq.Config{DeadLetterQueue: "dlq"}, effect: permanent, want: once.JobAck, wantStatus: once.StatusFailed},
		{name: "permanent failure dead-lettered", cfg: rabbitmq.Config{DeadLetterQueue: "dlq", DeadLetterFailed: true}, effect: permanent, want: once.JobDrop, wantStatus: once.StatusFailed, dead: true},
		{name: "review dead-lettered", cfg: rabbitmq.Config{DeadLetterQueue: "dlq"}, effect: unknown, want: once.JobDrop, wantStatus: once.StatusReview, dead: true},
		{name: "undecodable job dead-lettered", cfg: rabbitmq.Config{DeadLetterQueue: "dlq"}, body: []byte("{not json"), want: once.JobDrop, dead: true},
		{name: "review without a dead-letter queue is discarded", effect: unknown, want: once.JobDrop, wantStatus: once.StatusReview},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.cfg, nil)
			j := job{ID: "order-" + tc.name, To: "eve@example.com"}
			msg := j.publishing()
			if tc.body != nil {
				msg.Body = tc.body
			}
			if err := b.q.Publish(context.Background(), msg); err != nil {
				t.Fatal(err)
			}
			c := consume(t, b, nil, b.q.Name())
			disp := b.handle(t, c.next(t, 10*time.Second), work(b.client, "send_email", tc.effect))
			if disp.Action != tc.want {
				t.Fatalf("%s (%s), want %s", disp.Action, disp.Reason, tc.want)
			}
			if tc.wantStatus != "" {
				if a := b.status(t, j.intent("send_email")); a.Status != tc.wantStatus {
					t.Errorf("action is %s, want %s", a.Status, tc.wantStatus)
				}
			}
			want := map[string]int{}
			if tc.dead {
				want[b.cfg.DeadLetterQueue] = 1
			}
			b.drained(t, want, c)
			if !tc.dead {
				return
			}
			dc := consume(t, b, nil, b.cfg.DeadLetterQueue)
			d := dc.next(t, 10*time.Second)
			if string(d.Body) != string(msg.Body) || d.MessageId != msg.MessageId || deathReason(d) != "rejected" {
				t.Errorf("dead-lettered %q (id %q, reason %q), want the job %q rejected", d.Body, d.MessageId, deathReason(d), msg.Body)
			}
			d.Ack(false)
		})
	}
}

// When the worker is stopping, a job to retry is requeued for another
// consumer instead of being copied to a retry queue.
func TestStoppingWorkerRequeues(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{MinRetryDelay: 10 * time.Second}, nil)
	j := job{ID: "stop-1", To: "dan"}
	b.publish(t, j)
	c := consume(t, b, nil, b.q.Name())
	var s sender
	ctx, cancel := context.WithCancel(context.Background())
	stopping := func(ectx context.Context, a once.Attempt) (string, error) {
		cancel() // the worker is told to stop while the effect runs
		<-ectx.Done()
		return "", once.RetryLater(ectx.Err()) // nothing was sent
	}
	disp, err := b.q.Handle(ctx, c.next(t, 10*time.Second), work(b.client, "send_email", stopping))
	if err != nil {
		t.Fatal(err)
	}
	if disp.Action != once.JobRetry || disp.After != 0 || !strings.Contains(disp.Reason, "requeued") {
		t.Fatalf("%s after %v (%s), want requeued at once", disp.Action, disp.After, disp.Reason)
	}
	// Back at once (MinRetryDelay is 10s), from the work queue.
	d := c.next(t, 5*time.Second)
	if !d.Redelivered || rabbitmq.Retries(d) != 0 {
		t.Errorf("redelivered %v with retry count %d, want a requeued original", d.Redelivered, rabbitmq.Retries(d))
	}
	if disp := b.handle(t, d, work(b.client, "send_email", s.sends)); disp.Action != once.JobAck {
		t.Fatalf("%s, want ack", disp.Action)
	}
	if n := s.sent.Load(); n != 1 {
		t.Errorf("sent %d, want 1", n)
	}
	b.drained(t, nil, c)
}

// Bad input gets an error that says what to pass, and a job handed to
// Handle without a work function is requeued, not left unacked.
func TestHandleBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{}, nil)
	if _, err := b.q.Handle(context.Background(), amqp.Delivery{}, func(context.Context, amqp.Delivery) error { return nil }); !contains(err, "Channel.Consume") {
		t.Errorf("a zero Delivery: %v", err)
	}
	b.publish(t, job{ID: "n", To: "m"})
	c := consume(t, b, nil, b.q.Name())
	if _, err := b.q.Handle(context.Background(), c.next(t, 10*time.Second), nil); !contains(err, "nil work function") {
		t.Errorf("nil work: %v", err)
	}
	d := c.next(t, 10*time.Second)
	if !d.Redelivered {
		t.Error("the job was not requeued")
	}
	d.Ack(false)
	b.drained(t, nil, c)
}

func TestNewRefusesBadConfig(t *testing.T) {
	conn := new(amqp.Connection) // never used: New does no I/O
	for _, tc := range []struct {
		cfg  rabbitmq.Config
		want string
	}{
		{rabbitmq.Config{Queue: "jobs"}, "Config.Conn is nil"},
		{rabbitmq.Config{Conn: conn}, "Config.Queue is empty"},
		{rabbitmq.Config{Conn: conn, Queue: "amq.jobs"}, "reserves"},
		{rabbitmq.Config{Conn: conn, Queue: "jobs", DeadLetterQueue: "jobs"}, "DeadLetterQueue is the work queue"},
		{rabbitmq.Config{Conn: conn, Queue: "jobs", MinRetryDelay: -1}, "must not be negative"},
		{rabbitmq.Config{Conn: conn, Queue: "jobs", MinRetryDelay: 1500 * time.Microsecond}, "whole number of milliseconds"},
		{rabbitmq.Config{Conn: conn, Queue: "jobs", MinRetryDelay: time.Minute, MaxRetryDelay: time.Second}, "shorter than MinRetryDelay"},
		{rabbitmq.Config{Conn: conn, Queue: "jobs", MinRetryDelay: time.Millisecond, MaxRetryDelay: 1000 * time.Hour}, "retry queues"},
		{rabbitmq.Config{Conn: conn, Queue: strings.Repeat("q", 250)}, "at most 255"},
		{rabbitmq.Config{Conn: conn, Queue: "jobs", DeadLetterQueue: "dead", QueueArgs: amqp.Table{"x-dead-letter-exchange": "dlx"}}, "leave one of them out"},
	} {
		if _, err := rabbitmq.New(tc.cfg); !contains(err, tc.want) {
			t.Errorf("New(%+v) = %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
}

// Declare is idempotent, and names a queue that exists with other
// arguments.
func TestDeclare(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{DeadLetterQueue: "dlq"}, nil)
	if err := b.q.Declare(context.Background()); err != nil {
		t.Fatalf("declaring twice: %v", err)
	}
	q2, err := rabbitmq.New(rabbitmq.Config{Conn: rabbitmqtest.Dial(t), Queue: b.q.Name(), QueueArgs: amqp.Table{"x-max-length": int32(5)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := q2.Declare(context.Background()); !contains(err, b.q.Name()) || !contains(err, "exists with other settings") {
		t.Errorf("declaring the work queue with other arguments: %v", err)
	}
}

// Many goroutines publish through one Queue at once: every message is
// confirmed and arrives once.
func TestConcurrentPublishing(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{}, nil)
	redrive := b.q.Redrive(func(a once.Action) (amqp.Publishing, error) {
		return job{ID: a.Run, To: a.Target}.publishing(), nil
	})
	const n = 60
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if i%2 == 0 {
				errs <- b.q.Publish(context.Background(), job{ID: fmt.Sprint("p", i), To: "x"}.publishing())
				return
			}
			errs <- redrive(context.Background(), once.Action{Key: once.Key(fmt.Sprint("k", i)), Attempt: 1, Run: fmt.Sprint("r", i)})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	c := consume(t, b, nil, b.q.Name())
	seen := map[string]bool{}
	for range n {
		d := c.next(t, 10*time.Second)
		if seen[d.MessageId] {
			t.Errorf("message %s arrived twice", d.MessageId)
		}
		seen[d.MessageId] = true
		d.Ack(false)
	}
	b.drained(t, nil, c)
}

// A publish to a queue that does not exist is returned by the broker
// (the message is mandatory) and reported, not taken for delivered; the
// channel goes on working.
func TestPublishUnroutable(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{}, nil)
	q, err := rabbitmq.New(rabbitmq.Config{Conn: b.cfg.Conn, Queue: uniqueName(t)}) // never declared
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	err = q.Redrive(func(once.Action) (amqp.Publishing, error) { return amqp.Publishing{Body: []byte("x")}, nil })(context.Background(), once.Action{Key: "k", Attempt: 1})
	if !contains(err, "does not exist") {
		t.Errorf("re-driving to a missing queue: %v", err)
	}
	if err := q.Publish(context.Background(), amqp.Publishing{Body: []byte("x")}); !contains(err, "does not exist") {
		t.Errorf("publishing to a missing queue: %v", err)
	}
	err = q.Redrive(func(once.Action) (amqp.Publishing, error) { return amqp.Publishing{}, errors.New("no such order") })(context.Background(), once.Action{Key: "k"})
	if !contains(err, "no such order") {
		t.Errorf("a build error: %v", err)
	}
	if err := q.Redrive(nil)(context.Background(), once.Action{Key: "k"}); !contains(err, "nil build function") {
		t.Errorf("a nil build: %v", err)
	}
	b.publish(t, job{ID: "after", To: "x"}) // b.q shares the connection
	if got := depth(t, b.url, b.q.Name()); got != 1 {
		t.Errorf("work queue holds %d, want 1", got)
	}
}

// A job that once expired from the work queue to the dead-letter queue
// and was moved back by hand carries the broker's x-death record naming
// the work queue. The broker takes such a message, dead-lettered to the
// work queue again with no rejection between, for a dead-letter cycle
// and drops it: the retry copy leaves the record out, so the job comes
// back from the retry queue.
func TestRetryOfJobMovedBackFromDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: time.Second}, nil)
	j := job{ID: "moved-back", To: "ada"}
	msg := j.publishing()
	msg.Headers = amqp.Table{"x-death": []any{amqp.Table{
		"queue": b.q.Name(), "reason": "expired", "count": int64(1), "exchange": "",
		"routing-keys": []any{b.q.Name()}, "time": time.Now().Truncate(time.Second),
	}}}
	if err := b.q.Publish(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	c := consume(t, b, nil, b.q.Name())
	var s sender
	calls := 0
	w := work(b.client, "send_email", func(ctx context.Context, a once.Attempt) (string, error) {
		calls++
		if calls == 1 {
			return "", once.RetryLater(errBusy)
		}
		return s.sends(ctx, a)
	})
	if disp := b.handle(t, c.next(t, 10*time.Second), w); disp.Action != once.JobRetry {
		t.Fatalf("%s, want retry", disp.Action)
	}
	d := c.next(t, 10*time.Second)
	if disp := b.handle(t, d, w); disp.Action != once.JobAck {
		t.Fatalf("%s, want ack", disp.Action)
	}
	if n := s.sent.Load(); n != 1 {
		t.Errorf("sent %d, want 1", n)
	}
	b.drained(t, nil, c)
}
