package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/rabbitmqtest"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/rabbitmq"
	"github.com/oncehq/once/sqlite"
)

// bundle is what a test works with: a declared queue on the broker
// (deleted when the test ends), a once client over a SQLite file, and
// the URL both came from.
type bundle struct {
	url    string
	q      *rabbitmq.Queue
	cfg    rabbitmq.Config
	client *once.Client
	store  *sqlite.Store
	dbPath string
	// queues are every queue the test declared, for draining and
	// deletion.
	queues []string
}

// setup declares a work queue with a unique name and its retry queues
// (and a dead-letter queue when cfg names one: pass "dlq" and it is made
// unique), and makes a once client whose config ocfg may build from the
// Queue (a Redrive hook, say).
func setup(t *testing.T, cfg rabbitmq.Config, ocfg func(*rabbitmq.Queue) once.Config) *bundle {
	t.Helper()
	b := &bundle{url: rabbitmqtest.Require(t)}
	name := uniqueName(t)
	if cfg.Conn == nil {
		cfg.Conn = rabbitmqtest.Dial(t)
	}
	cfg.Queue = name
	if cfg.DeadLetterQueue != "" {
		cfg.DeadLetterQueue = name + ".dead"
	}
	q, err := rabbitmq.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.q, b.cfg = q, cfg
	b.queues = append([]string{name}, q.RetryQueues()...)
	if cfg.DeadLetterQueue != "" {
		b.queues = append(b.queues, cfg.DeadLetterQueue)
	}
	t.Cleanup(func() { deleteQueues(t, b.url, b.queues...) })
	t.Cleanup(func() { q.Close() })
	if err := q.Declare(context.Background()); err != nil {
		t.Fatal(err)
	}

	store, path := testdb.NewSQLite(t)
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	var oc once.Config
	if ocfg != nil {
		oc = ocfg(q)
	}
	oc.Store = store
	client, err := once.New(oc)
	if err != nil {
		t.Fatal(err)
	}
	b.client, b.store, b.dbPath = client, store, path
	return b
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// uniqueName is a queue name no other test, run or checkout uses.
func uniqueName(t testing.TB) string {
	var r [4]byte
	rand.Read(r[:])
	n := unsafeChars.ReplaceAllString(t.Name(), "-")
	if len(n) > 80 {
		n = n[:80]
	}
	return "once-test." + n + "." + hex.EncodeToString(r[:])
}

// deleteQueues deletes the test's queues on a connection of its own: the
// test may have closed or broken its connections.
func deleteQueues(t testing.TB, url string, names ...string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("deleting the test's queues: %v", err)
		return
	}
	defer conn.Close()
	for _, n := range names {
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("deleting queue %s: %v", n, err)
			return
		}
		if _, err := ch.QueueDelete(n, false, false, false); err != nil {
			t.Errorf("deleting queue %s: %v", n, err)
		}
		ch.Close()
	}
}

// depth is the number of ready messages in a queue (not counting those
// delivered and unacked).
func depth(t testing.TB, url, name string) int {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	qi, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting queue %s: %v", name, err)
	}
	return qi.Messages
}

// consumer takes deliveries from one queue in manual-ack mode.
type consumer struct {
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	closeOnce  sync.Once
}

// consume starts a consumer on conn (the test's own connection when nil).
func consume(t *testing.T, b *bundle, conn *amqp.Connection, queue string) *consumer {
	t.Helper()
	if conn == nil {
		conn = rabbitmqtest.Dial(t)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &consumer{ch: ch, deliveries: ds}
	t.Cleanup(c.stop)
	return c
}

// stop cancels the consumer: its unacked deliveries go back to the queue.
func (c *consumer) stop() { c.closeOnce.Do(func() { c.ch.Close() }) }

// next waits up to within for the next delivery.
func (c *consumer) next(t *testing.T, within time.Duration) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-c.deliveries:
		if !ok {
			t.Fatal("the consumer's channel closed")
		}
		return d
	case <-time.After(within):
		t.Fatalf("no delivery within %v", within)
	}
	return amqp.Delivery{}
}

// drained stops the consumers (their unacked deliveries go back) and
// checks that every queue of the test holds what want says (zero for a
// queue not named): nothing is left to be delivered again.
func (b *bundle) drained(t *testing.T, want map[string]int, cs ...*consumer) {
	t.Helper()
	for _, c := range cs {
		c.stop()
	}
	for _, n := range b.queues {
		if got := depth(t, b.url, n); got != want[n] {
			t.Errorf("queue %s holds %d messages, want %d", n, got, want[n])
		}
	}
}

// job is what the tests publish: the job's own id and its recipient.
type job struct {
	ID string `json:"id"`
	To string `json:"to"`
}

func (j job) publishing() amqp.Publishing {
	body, _ := json.Marshal(j)
	return amqp.Publishing{ContentType: "application/json", MessageId: j.ID, Body: body}
}

func (j job) intent(kind string) once.Intent {
	return once.Intent{Run: j.ID, Kind: kind, Target: j.To}
}

// publish puts jobs on the work queue.
func (b *bundle) publish(t *testing.T, jobs ...job) {
	t.Helper()
	for _, j := range jobs {
		if err := b.q.Publish(context.Background(), j.publishing()); err != nil {
			t.Fatal(err)
		}
	}
}

// sender stands for the provider: it counts the effects that happened
// and remembers the provider keys and attempts it was called with.
type sender struct {
	sent  atomic.Int64
	mu    sync.Mutex
	calls []once.Attempt
}

func (s *sender) record(a once.Attempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, a)
}

func (s *sender) attempts() []once.Attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]once.Attempt(nil), s.calls...)
}

// work decodes a job and sends it through once.Do with effect.
func work(c *once.Client, kind string, effect func(context.Context, once.Attempt) (string, error)) func(context.Context, amqp.Delivery) error {
	return func(ctx context.Context, d amqp.Delivery) error {
		var j job
		if err := json.Unmarshal(d.Body, &j); err != nil {
			return once.Permanent(fmt.Errorf("the job does not decode: %w", err))
		}
		_, err := once.Do(ctx, c, j.intent(kind), effect)
		return err
	}
}

// sends is an effect that always lands.
func (s *sender) sends(_ context.Context, a once.Attempt) (string, error) {
	s.record(a)
	s.sent.Add(1)
	return "sent", nil
}

// handle runs b.q.Handle and fails the test on a settle error.
func (b *bundle) handle(t *testing.T, d amqp.Delivery, w func(context.Context, amqp.Delivery) error) once.Disposition {
	t.Helper()
	disp, err := b.q.Handle(context.Background(), d, w)
	if err != nil {
		t.Fatalf("Handle: %v (disposition %s: %s)", err, disp.Action, disp.Reason)
	}
	return disp
}

// status is the action's status in the store.
func (b *bundle) status(t *testing.T, in once.Intent) once.Action {
	t.Helper()
	k, _, err := once.KeyOf(in)
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.store.Get(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// deathReason is the reason of the broker's latest dead-lettering of d.
func deathReason(d amqp.Delivery) string {
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) == 0 {
		return ""
	}
	first, _ := deaths[0].(amqp.Table)
	r, _ := first["reason"].(string)
	return r
}

func contains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }

var errBusy = errors.New("provider busy (429)")
