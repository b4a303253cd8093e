package rabbitmq_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/rabbitmq"
	"github.com/oncehq/once/sqlite"
)

// A released action whose job nobody will deliver again is published
// again by the reaper through the Redrive hook, and runs once more with
// the same provider key.
func TestRedriveReleasedAction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		recovery once.Recovery
		// lose makes the job disappear after the first delivery was
		// settled: a person's Retry on a dropped job, or a retry copy
		// lost on its way back.
		lose    func(t *testing.T, b *bundle, k once.Key)
		settled once.JobAction
	}{
		{
			name: "a person retried a dropped job", recovery: once.AskPerson, settled: once.JobDrop,
			lose: func(t *testing.T, b *bundle, k once.Key) {
				if _, err := b.client.Resolve(context.Background(), k, once.Resolution{Decision: once.DecisionRetry, By: "ops", Note: "nothing was charged"}); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "recovery released it and its retry copy was lost", recovery: once.RetryWithProviderKey, settled: once.JobRetry,
			lose: func(t *testing.T, b *bundle, _ once.Key) {
				purgeRetryQueues(t, b)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			build := func(a once.Action) (amqp.Publishing, error) {
				return job{ID: a.Run, To: a.Target}.publishing(), nil
			}
			b := setup(t, rabbitmq.Config{DeadLetterQueue: "dlq", MinRetryDelay: time.Minute, MaxRetryDelay: time.Minute},
				func(q *rabbitmq.Queue) once.Config {
					return once.Config{Kinds: map[string]once.KindPolicy{"charge": {
						Recovery: tc.recovery, Redrive: q.Redrive(build), RedriveAfter: 50 * time.Millisecond,
					}}}
				})
			j := job{ID: "order-77", To: "cus_77"}
			k, _, _ := once.KeyOf(j.intent("charge"))
			var s sender
			calls := 0
			effect := func(ctx context.Context, a once.Attempt) (string, error) {
				calls++
				if calls == 1 {
					s.record(a)
					return "", errors.New("connection reset after the request was sent")
				}
				return s.sends(ctx, a)
			}
			w := work(b.client, "charge", effect)
			b.publish(t, j)
			c := consume(t, b, nil, b.q.Name())
			if disp := b.handle(t, c.next(t, 10*time.Second), w); disp.Action != tc.settled {
				t.Fatalf("first delivery: %s (%s), want %s", disp.Action, disp.Reason, tc.settled)
			}
			tc.lose(t, b, k)
			if a := b.status(t, j.intent("charge")); a.Status != once.StatusReleased || a.Attempt != 1 {
				t.Fatalf("action is %s at attempt %d, want released at 1", a.Status, a.Attempt)
			}
			if got := depth(t, b.url, b.q.Name()); got != 0 {
				t.Fatalf("the work queue holds %d jobs; the test needs the job gone", got)
			}

			reaper, err := once.NewReaper(b.client, once.ReaperConfig{})
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				rep, err := reaper.RunOnce(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if rep.Redriven == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the reaper never re-drove the released action; last pass %+v", rep)
				}
				time.Sleep(20 * time.Millisecond)
			}
			d := c.next(t, 10*time.Second)
			if want := rabbitmq.RedriveMessageID(once.Action{Key: k, Attempt: 1}); d.MessageId != want || d.DeliveryMode != amqp.Persistent {
				t.Errorf("re-driven job has id %q, mode %d; want %q, persistent", d.MessageId, d.DeliveryMode, want)
			}
			if disp := b.handle(t, d, w); disp.Action != once.JobAck {
				t.Fatalf("re-driven job: %s (%s), want ack", disp.Action, disp.Reason)
			}
			got := s.attempts()
			if len(got) != 2 || got[0].ProviderKey != got[1].ProviderKey || got[0].Number != 1 || got[1].Number != 2 {
				t.Errorf("effect calls %+v, want attempts 1 and 2 with the same provider key", got)
			}
			if a := b.status(t, j.intent("charge")); a.Status != once.StatusSucceeded {
				t.Errorf("action is %s, want succeeded", a.Status)
			}
			if rep, err := reaper.RunOnce(context.Background()); err != nil || rep.Redriven != 0 {
				t.Errorf("a pass after the action ran: %+v, %v; want nothing re-driven", rep, err)
			}
			want := map[string]int{}
			if tc.settled == once.JobDrop {
				want[b.cfg.DeadLetterQueue] = 1
			}
			b.drained(t, want, c)
		})
	}
}

func purgeRetryQueues(t *testing.T, b *bundle) {
	t.Helper()
	conn, err := amqp.Dial(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	purged := 0
	for _, n := range b.q.RetryQueues() {
		m, err := ch.QueuePurge(n, false)
		if err != nil {
			t.Fatal(err)
		}
		purged += m
	}
	if purged != 1 {
		t.Fatalf("purged %d retry copies, want the one", purged)
	}
}

// proxied starts a fault proxy in front of the broker and returns it
// with the URL that goes through it.
func proxied(t *testing.T, url string) (*faultproxy.Proxy, string) {
	t.Helper()
	uri, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	uri.Host, uri.Port = "127.0.0.1", p.Port()
	return p, uri.String()
}

func dial(t *testing.T, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A worker's connection breaks while its effect runs: the broker
// delivers the unacked job to another worker, which finds the claim
// held and retries after the lease; the first worker's effect finishes
// and is recorded, its ack fails (reported), and the job, back from the
// retry queue, replays the result. The effect happened once.
func TestConnectionLostMidEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, rabbitmq.Config{MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: 10 * time.Second},
		func(*rabbitmq.Queue) once.Config { return once.Config{Default: once.KindPolicy{Lease: time.Second}} })
	proxy, viaProxy := proxied(t, b.url)
	j := job{ID: "mid-effect", To: "ada"}
	b.publish(t, j)

	var s sender
	started, finish := make(chan struct{}), make(chan struct{})
	var startOnce sync.Once
	effect := func(ctx context.Context, a once.Attempt) (string, error) {
		startOnce.Do(func() { close(started) })
		<-finish
		return s.sends(ctx, a)
	}
	w := work(b.client, "send_email", effect)
	cA := consume(t, b, dial(t, viaProxy), b.q.Name())
	d1 := cA.next(t, 10*time.Second)
	type result struct {
		disp once.Disposition
		err  error
	}
	first := make(chan result, 1)
	go func() {
		disp, err := b.q.Handle(context.Background(), d1, w)
		first <- result{disp, err}
	}()
	<-started
	proxy.Reset() // the first worker's connection is gone mid-effect

	cB := consume(t, b, nil, b.q.Name())
	d2 := cB.next(t, 10*time.Second)
	if !d2.Redelivered {
		t.Error("the job reached the second worker not marked redelivered")
	}
	if disp := b.handle(t, d2, w); disp.Action != once.JobRetry || disp.After <= 0 {
		t.Fatalf("second worker: %s after %v (%s), want retry after the lease", disp.Action, disp.After, disp.Reason)
	}
	close(finish)
	r := <-first
	if r.disp.Action != once.JobAck || r.err == nil {
		t.Errorf("first worker: %s, %v; want ack, and the error that the ack could not be sent", r.disp.Action, r.err)
	}
	d3 := cB.next(t, 15*time.Second)
	if disp := b.handle(t, d3, w); disp.Action != once.JobAck {
		t.Fatalf("the job back from the retry queue: %s (%s), want ack", disp.Action, disp.Reason)
	}
	if n := s.sent.Load(); n != 1 {
		t.Errorf("the effect happened %d times, want once", n)
	}
	b.drained(t, nil, cA, cB)
}

// A retry whose copy cannot be confirmed does not lose the job: the
// original is requeued. When the copy did reach the broker and only its
// confirm was lost, the job arrives twice, and once absorbs it.
func TestRetryWithoutConfirmKeepsJob(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// breakIt breaks the publishing connection of q (through p) and
		// says how many retry copies reach the broker.
		breakIt func(conn *amqp.Connection, p *faultproxy.Proxy, marker string) (copies int, cut <-chan struct{})
	}{
		{"publishing connection closed", func(conn *amqp.Connection, _ *faultproxy.Proxy, _ string) (int, <-chan struct{}) {
			conn.Close()
			return 0, nil
		}},
		{"connection cut before the confirm", func(_ *amqp.Connection, p *faultproxy.Proxy, marker string) (int, <-chan struct{}) {
			return 1, p.CutAfter([]byte(marker), nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const floor = 300 * time.Millisecond
			b := setup(t, rabbitmq.Config{MinRetryDelay: floor, MaxRetryDelay: time.Second}, nil)
			proxy, viaProxy := proxied(t, b.url)
			pubConn := dial(t, viaProxy)
			broken, err := rabbitmq.New(rabbitmq.Config{Conn: pubConn, Queue: b.q.Name(), MinRetryDelay: floor, MaxRetryDelay: time.Second, ConfirmTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer broken.Close()
			j := job{ID: uniqueName(t), To: "ada"}
			b.publish(t, j)

			var s sender
			calls := 0
			effect := func(ctx context.Context, a once.Attempt) (string, error) {
				calls++
				if calls == 1 {
					return "", once.RetryLater(errBusy)
				}
				return s.sends(ctx, a)
			}
			w := work(b.client, "send_email", effect)
			c := consume(t, b, nil, b.q.Name())
			d1 := c.next(t, 10*time.Second)
			copies, cut := tc.breakIt(pubConn, proxy, j.ID)
			start := time.Now()
			disp, err := broken.Handle(context.Background(), d1, w)
			if err == nil || disp.Action != once.JobRetry || disp.After != 0 {
				t.Fatalf("a retry that could not be confirmed: %s after %v, %v; want requeued with an error", disp.Action, disp.After, err)
			}
			// A publisher that fails at once must not make a hot loop: the
			// job is held for the floor before it is requeued.
			if took := time.Since(start); took < floor {
				t.Errorf("the job was requeued %v after it came, before the floor of %v", took, floor)
			}
			t.Logf("Handle: %v", err)
			if cut != nil {
				select {
				case <-cut:
				default:
					t.Fatal("the proxy did not cut the connection after the copy")
				}
			}
			// The original comes back at once, not through a retry queue.
			d2 := c.next(t, 10*time.Second)
			if !d2.Redelivered || rabbitmq.Retries(d2) != 0 {
				t.Errorf("second delivery: redelivered %v, retry count %d; want the requeued original", d2.Redelivered, rabbitmq.Retries(d2))
			}
			if disp := b.handle(t, d2, w); disp.Action != once.JobAck {
				t.Fatalf("%s (%s), want ack", disp.Action, disp.Reason)
			}
			for i := range copies {
				d := c.next(t, 10*time.Second)
				if rabbitmq.Retries(d) != 1 {
					t.Errorf("copy %d has retry count %d, want 1", i+1, rabbitmq.Retries(d))
				}
				if disp := b.handle(t, d, w); disp.Action != once.JobAck {
					t.Fatalf("the late copy: %s (%s), want ack (replayed)", disp.Action, disp.Reason)
				}
			}
			if n := s.sent.Load(); n != 1 {
				t.Errorf("the effect happened %d times, want once", n)
			}
			b.drained(t, nil, c)
		})
	}
}

// The killed-worker test's worker process reads these.
const (
	envChild    = "ONCE_RABBITMQ_TEST_CHILD"
	envURL      = "ONCE_RABBITMQ_TEST_URL"
	envQueue    = "ONCE_RABBITMQ_TEST_QUEUE"
	envDB       = "ONCE_RABBITMQ_TEST_DB"
	envFile     = "ONCE_RABBITMQ_TEST_FILE"
	envRecovery = "ONCE_RABBITMQ_TEST_RECOVERY"
)

const childLease = time.Second

// A worker process is killed (SIGKILL) while its effect runs: the broker
// delivers the unacked job to another worker, which finds the claim held
// and retries after the lease; when it comes back the lease has lapsed
// and the kind's recovery decides. RetryWithProviderKey runs the effect
// again with the same provider key; AskPerson does not run it again and
// drops the job to the dead-letter queue for a person.
func TestKilledWorker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		recovery   once.Recovery
		effects    int
		settled    once.JobAction
		wantStatus once.Status
	}{
		{once.RetryWithProviderKey, 2, once.JobAck, once.StatusSucceeded},
		{once.AskPerson, 1, once.JobDrop, once.StatusReview},
	} {
		t.Run(tc.recovery.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, rabbitmq.Config{DeadLetterQueue: "dlq", MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: 10 * time.Second},
				func(*rabbitmq.Queue) once.Config {
					return once.Config{Default: once.KindPolicy{Lease: childLease, Recovery: tc.recovery}}
				})
			file := filepath.Join(t.TempDir(), "effects")
			j := job{ID: "killed-" + tc.recovery.String(), To: "cus_9"}
			b.publish(t, j)

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envChild+"=1", envURL+"="+b.url, envQueue+"="+b.q.Name(),
				envDB+"="+b.dbPath, envFile+"="+file, envRecovery+"="+tc.recovery.String())
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-exited
			})
			deadline := time.Now().Add(30 * time.Second)
			for len(effectLines(t, file)) == 0 {
				select {
				case err := <-exited:
					t.Fatalf("the worker exited before its effect: %v\n%s", err, stderr.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("the worker never ran its effect\n%s", stderr.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-exited
			exited <- nil // for the cleanup

			c := consume(t, b, nil, b.q.Name())
			w := work(b.client, "charge", func(ctx context.Context, a once.Attempt) (string, error) {
				return "charged", appendEffect(file, a)
			})
			var disp once.Disposition
			deliveries := 0
			for disp.Action = once.JobRetry; disp.Action == once.JobRetry; deliveries++ {
				if deliveries == 5 {
					t.Fatalf("still retried after %d deliveries: %s", deliveries, disp.Reason)
				}
				d := c.next(t, 15*time.Second)
				if deliveries == 0 && !d.Redelivered {
					t.Error("the killed worker's job came back not marked redelivered")
				}
				disp = b.handle(t, d, w)
				t.Logf("delivery %d: %s after %v (%s)", deliveries+1, disp.Action, disp.After, disp.Reason)
			}
			if deliveries < 2 {
				t.Errorf("settled on delivery %d: the lease cannot have lapsed yet", deliveries)
			}
			if disp.Action != tc.settled {
				t.Errorf("settled %s (%s), want %s", disp.Action, disp.Reason, tc.settled)
			}
			lines := effectLines(t, file)
			if len(lines) != tc.effects {
				t.Fatalf("effects %+v, want %d", lines, tc.effects)
			}
			if len(lines) == 2 && (lines[0].provider != lines[1].provider || lines[0].attempt != 1 || lines[1].attempt != 2 || lines[0].pid == lines[1].pid) {
				t.Errorf("effects %+v, want attempt 1 in the killed worker and attempt 2 here, with the same provider key", lines)
			}
			if a := b.status(t, j.intent("charge")); a.Status != tc.wantStatus {
				t.Errorf("action is %s, want %s", a.Status, tc.wantStatus)
			}
			want := map[string]int{}
			if tc.settled == once.JobDrop {
				want[b.cfg.DeadLetterQueue] = 1
			}
			b.drained(t, want, c)
		})
	}
}

type effectLine struct {
	pid, attempt int
	provider     string
}

// appendEffect records an effect in the file the test reads: the process,
// the attempt and its provider key.
func appendEffect(file string, a once.Attempt) error {
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return once.RetryLater(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%d %d %s\n", os.Getpid(), a.Number, a.ProviderKey); err != nil {
		return err
	}
	return f.Sync()
}

func effectLines(t *testing.T, file string) []effectLine {
	t.Helper()
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []effectLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l effectLine
		if _, err := fmt.Sscan(sc.Text(), &l.pid, &l.attempt, &l.provider); err != nil {
			t.Fatalf("effect line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

// childMain is the killed-worker test's worker: it takes one job, runs
// its effect, records it, and hangs there until it is killed.
func childMain() int {
	if err := child(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

func child() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := sqlite.Open(os.Getenv(envDB), sqlite.Config{})
	if err != nil {
		return err
	}
	defer store.Close()
	client, err := once.New(once.Config{Store: store, Default: once.KindPolicy{Lease: childLease, Recovery: once.ParseRecovery(os.Getenv(envRecovery))}})
	if err != nil {
		return err
	}
	conn, err := amqp.Dial(os.Getenv(envURL))
	if err != nil {
		return err
	}
	defer conn.Close()
	q, err := rabbitmq.New(rabbitmq.Config{Conn: conn, Queue: os.Getenv(envQueue)})
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return err
	}
	ds, err := ch.Consume(q.Name(), "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	var d amqp.Delivery
	select {
	case d = <-ds:
	case <-ctx.Done():
		return errors.New("no job came")
	}
	file := os.Getenv(envFile)
	_, err = q.Handle(ctx, d, work(client, "charge", func(ctx context.Context, a once.Attempt) (string, error) {
		if err := appendEffect(file, a); err != nil {
			return "", err
		}
		<-ctx.Done() // the test kills the process here
		return "", ctx.Err()
	}))
	return fmt.Errorf("the worker was meant to be killed inside its effect; Handle returned %v", err)
}
