package natsjs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/natstest"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/natsjs"
)

func TestMain(m *testing.M) {
	// The worker process of TestWorkerKilled is this test binary,
	// started again.
	maybeChild()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// job is what the tests publish: a charge of a customer.
type job struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Amount   int    `json:"amount"`
}

func (j job) intent() once.Intent {
	return once.Intent{Run: j.ID, Kind: "charge", Target: j.Customer, Payload: map[string]int{"amount": j.Amount}}
}

// jobOf rebuilds a job from its action, as a Redrive build function
// does: Run is the job's id, Target the customer, Payload the amount.
func jobOf(a once.Action) (job, error) {
	var p struct{ Amount int }
	if err := json.Unmarshal(a.Payload, &p); err != nil {
		return job{}, err
	}
	return job{ID: a.Run, Customer: a.Target, Amount: p.Amount}, nil
}

// bundle is what setup returns: a stream and a durable consumer of the
// test's own on the real server, and a once client over SQLite.
type bundle struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	subject string
	cons    jetstream.Consumer
	client  *once.Client
	log     *record
}

func setup(t *testing.T, cc jetstream.ConsumerConfig, oc once.Config) *bundle {
	t.Helper()
	nc, js := natstest.Connect(t)
	s := natstest.Stream(t, js, jetstream.StreamConfig{})
	name := s.CachedInfo().Config.Name
	cc.Durable = "worker"
	cc.AckPolicy = jetstream.AckExplicitPolicy
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := s.CreateConsumer(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	client, _ := testdb.SQLiteClient(t, oc)
	return &bundle{nc: nc, js: js, stream: name, subject: name + ".jobs", cons: cons, client: client, log: &record{}}
}

func (b *bundle) publish(t *testing.T, j job) {
	t.Helper()
	data, _ := json.Marshal(j)
	b.publishRaw(t, data)
}

func (b *bundle) publishRaw(t *testing.T, data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.js.Publish(ctx, b.subject, data); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) info(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	i, err := b.cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// settledAll waits until the consumer has every published message
// delivered and settled.
func (b *bundle) settledAll(t *testing.T, published uint64) *jetstream.ConsumerInfo {
	t.Helper()
	var i *jetstream.ConsumerInfo
	waitFor(t, 20*time.Second, func() bool {
		i = b.info(t)
		return i.Delivered.Stream == published && i.NumAckPending == 0 && i.NumPending == 0
	}, "every message delivered and settled")
	return i
}

// worker returns a worker over b's connection that records every
// settlement in b.log.
func (b *bundle) worker(t *testing.T, cfg natsjs.Config) *natsjs.Worker {
	t.Helper()
	return workerOn(t, b.js, cfg, b.log)
}

func workerOn(t *testing.T, js jetstream.JetStream, cfg natsjs.Config, log *record) *natsjs.Worker {
	t.Helper()
	cfg.OnSettle = log.settled
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = 50 * time.Millisecond
	}
	w, err := natsjs.New(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// consumer is a w.Consume running in the background.
type consumer struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// consume runs w.Consume until stop is called or the test ends.
func consume(t *testing.T, w *natsjs.Worker, cons jetstream.Consumer, fn natsjs.JobFunc) *consumer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- w.Consume(ctx, cons, fn) }()
	t.Cleanup(func() { c.stop() })
	return c
}

// stop ends Consume's context and returns what Consume returned. A test
// that acts while Consume drains calls cancel first.
func (c *consumer) stop() error {
	c.once.Do(func() {
		c.cancel()
		c.err = <-c.done
	})
	return c.err
}

// closer returns a func that closes ch the first time it is called.
func closer(ch chan struct{}) func() {
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// charge is a job function that runs effect through once.Do, and
// records each delivery in log.
func charge(c *once.Client, log *record, effect func(context.Context, once.Attempt) (string, error)) natsjs.JobFunc {
	return func(ctx context.Context, msg jetstream.Msg) error {
		var j job
		if err := json.Unmarshal(msg.Data(), &j); err != nil {
			return once.Permanent(fmt.Errorf("decoding the job: %w", err))
		}
		res, err := once.Do(ctx, c, j.intent(), effect)
		log.delivered(msg, res.Replayed)
		return err
	}
}

// record collects what happened to the messages, for the assertions.
type record struct {
	mu         sync.Mutex
	settles    []settle
	deliveries []delivery
	effects    []once.Attempt
}

type settle struct {
	seq, delivered uint64
	d              once.Disposition
	err            error
	at             time.Time
}

type delivery struct {
	seq, delivered uint64
	msgID          string
	replayed       bool
	at             time.Time
}

func (r *record) settled(msg jetstream.Msg, d once.Disposition, err error) {
	m, _ := msg.Metadata()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.settles = append(r.settles, settle{seq: m.Sequence.Stream, delivered: m.NumDelivered, d: d, err: err, at: time.Now()})
}

func (r *record) delivered(msg jetstream.Msg, replayed bool) {
	m, _ := msg.Metadata()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deliveries = append(r.deliveries, delivery{seq: m.Sequence.Stream, delivered: m.NumDelivered, msgID: msg.Headers().Get(jetstream.MsgIDHeader), replayed: replayed, at: time.Now()})
}

func (r *record) effect(a once.Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.effects = append(r.effects, a)
}

func (r *record) snapshot() ([]settle, []delivery, []once.Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]settle(nil), r.settles...), append([]delivery(nil), r.deliveries...), append([]once.Attempt(nil), r.effects...)
}

// waitSettle waits for a settlement that match accepts and returns it.
func (r *record) waitSettle(t *testing.T, what string, match func(settle) bool) settle {
	t.Helper()
	var got settle
	waitFor(t, 20*time.Second, func() bool {
		ss, _, _ := r.snapshot()
		for _, s := range ss {
			if match(s) {
				got = s
				return true
			}
		}
		return false
	}, what)
	return got
}

func waitFor(t *testing.T, within time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDuplicateDeliveryRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
	w := b.worker(t, natsjs.Config{})
	c := consume(t, w, b.cons, charge(b.client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		return "ch_1", nil
	}))
	j := job{ID: "order-1", Customer: "cus_1", Amount: 100}
	b.publish(t, j)
	b.publish(t, j) // the same job, delivered twice

	i := b.settledAll(t, 2)
	if err := c.stop(); err != nil {
		t.Fatalf("Consume returned %v after its context ended; want nil", err)
	}
	settles, deliveries, effects := b.log.snapshot()
	if len(effects) != 1 {
		t.Fatalf("the effect ran %d times for one job delivered twice; want once", len(effects))
	}
	if len(settles) != 2 || len(deliveries) != 2 {
		t.Fatalf("%d settlements and %d deliveries; want 2 of each", len(settles), len(deliveries))
	}
	for _, s := range settles {
		if s.d.Action != once.JobAck || s.err != nil {
			t.Errorf("message %d settled %v (%v); want an ack without error", s.seq, s.d.Action, s.err)
		}
	}
	if deliveries[0].replayed || !deliveries[1].replayed {
		t.Errorf("replayed: first %v, second %v; want the second delivery replayed", deliveries[0].replayed, deliveries[1].replayed)
	}
	if i.NumRedelivered != 0 {
		t.Errorf("%d messages redelivered; want none", i.NumRedelivered)
	}
}

func TestInFlightRetriedAfterLease(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second}}})
	w := b.worker(t, natsjs.Config{Concurrency: 2})
	started := make(chan struct{})
	release := make(chan struct{})
	start := closer(started)
	consume(t, w, b.cons, charge(b.client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		start()
		<-release
		return "ch_1", nil
	}))
	j := job{ID: "order-2", Customer: "cus_2", Amount: 200}
	b.publish(t, j)
	<-started
	b.publish(t, j) // a duplicate while the first still runs

	nak := b.log.waitSettle(t, "the duplicate handed back", func(s settle) bool { return s.seq == 2 && s.delivered == 1 })
	if nak.d.Action != once.JobRetry || !errors.Is(nak.err, once.ErrInFlight) || nak.d.After <= 0 {
		t.Fatalf("the duplicate met the claim and was settled %v after %v (%v); want a retry after the lease, with ErrInFlight", nak.d.Action, nak.d.After, nak.err)
	}
	close(release)

	again := b.log.waitSettle(t, "the duplicate redelivered and acked", func(s settle) bool { return s.seq == 2 && s.d.Action == once.JobAck })
	b.settledAll(t, 2)
	settles, deliveries, effects := b.log.snapshot()
	if len(effects) != 1 {
		t.Fatalf("the effect ran %d times; want once", len(effects))
	}
	if again.delivered < 2 || again.err != nil {
		t.Fatalf("the duplicate was acked on delivery %d (%v); want a later delivery without error", again.delivered, again.err)
	}
	// NakWithDelay held the redelivery back: the server sends it no
	// sooner than the delay asked for.
	redelivered := false
	for _, d := range deliveries {
		if d.seq == 2 && d.at.After(nak.at) {
			redelivered = true
			if d.at.Sub(nak.at) < nak.d.After/2 {
				t.Errorf("redelivered %v after the nak; it asked for %v", d.at.Sub(nak.at), nak.d.After)
			}
		}
	}
	if !redelivered {
		t.Error("no delivery of the duplicate after the nak was recorded")
	}
	for _, s := range settles {
		if s.seq == 1 && (s.d.Action != once.JobAck || s.err != nil) {
			t.Errorf("the first delivery settled %v (%v); want ack", s.d.Action, s.err)
		}
	}
}

func TestPermanentIsTerminated(t *testing.T) {
	t.Parallel()
	// A short AckWait: a terminate the server ignored would show as a
	// redelivery within the wait below.
	b := setup(t, jetstream.ConsumerConfig{AckWait: time.Second}, once.Config{})
	w := b.worker(t, natsjs.Config{})
	consume(t, w, b.cons, charge(b.client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		return "", once.Permanent(errors.New("card declined"))
	}))
	b.publish(t, job{ID: "order-3", Customer: "cus_3", Amount: 300})
	b.publishRaw(t, []byte("not a job")) // refused before any Do

	i := b.settledAll(t, 2)
	settles, _, effects := b.log.snapshot()
	if len(effects) != 1 || len(settles) != 2 {
		t.Fatalf("%d effects and %d settlements; want 1 and 2", len(effects), len(settles))
	}
	for _, s := range settles {
		if s.d.Action != once.JobDrop {
			t.Errorf("message %d settled %v (%v); want drop (Term)", s.seq, s.d.Action, s.err)
		}
		if s.seq == 1 && !errors.Is(s.err, once.ErrFailed) || s.seq == 2 && !errors.Is(s.err, once.ErrPermanent) {
			t.Errorf("message %d: error %v", s.seq, s.err)
		}
		if errors.Is(s.err, natsjs.ErrNotSettled) {
			t.Errorf("message %d not settled: %v", s.seq, s.err)
		}
	}
	if i.NumRedelivered != 0 || i.Delivered.Consumer != 2 {
		t.Fatalf("%d redelivered, %d deliveries; want none redelivered, 2 deliveries", i.NumRedelivered, i.Delivered.Consumer)
	}
}

func TestInProgressKeepsMessage(t *testing.T) {
	t.Parallel()
	const ackWait = time.Second
	for _, tc := range []struct {
		name     string
		progress time.Duration
		want     func(deliveries int) bool
		say      string
	}{
		// Progress zero: a third of the consumer's AckWait.
		{"keep-alive", 0, func(n int) bool { return n == 1 }, "one delivery while the effect outlasts AckWait three times"},
		// The control: without a signal within AckWait, the server
		// delivers the message again while the effect runs.
		{"no keep-alive", time.Hour, func(n int) bool { return n >= 2 }, "a second delivery"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, jetstream.ConsumerConfig{AckWait: ackWait}, once.Config{})
			w := b.worker(t, natsjs.Config{Concurrency: 2, Progress: tc.progress})
			again := make(chan struct{})
			var againOnce sync.Once
			fn := charge(b.client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
				b.log.effect(a)
				select {
				case <-again:
				case <-time.After(3 * ackWait):
				}
				return "ch_1", nil
			})
			c := consume(t, w, b.cons, func(ctx context.Context, msg jetstream.Msg) error {
				if m, _ := msg.Metadata(); m.NumDelivered > 1 {
					againOnce.Do(func() { close(again) })
				}
				return fn(ctx, msg)
			})
			b.publish(t, job{ID: "order-4", Customer: "cus_4", Amount: 400})
			first := b.log.waitSettle(t, "the job settled", func(s settle) bool { return s.delivered == 1 })
			if tc.progress == 0 {
				b.settledAll(t, 1)
			}
			c.stop()
			if first.d.Action != once.JobAck {
				t.Fatalf("settled %v (%v); want ack", first.d.Action, first.err)
			}
			i := b.info(t)
			if n := int(i.Delivered.Consumer); !tc.want(n) {
				t.Fatalf("%d deliveries (%d redelivered); want %s", n, i.NumRedelivered, tc.say)
			}
			if _, _, effects := b.log.snapshot(); len(effects) != 1 {
				t.Fatalf("the effect ran %d times; want once", len(effects))
			}
		})
	}
}

func TestReaperRedrivesReleasedJob(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	var b *bundle
	build := func(a once.Action) (*nats.Msg, error) {
		j, err := jobOf(a)
		if err != nil {
			return nil, err
		}
		data, err := json.Marshal(j)
		return &nats.Msg{Subject: b.subject, Data: data}, err
	}
	pol := once.KindPolicy{Recovery: once.RetryWithProviderKey, Redrive: natsjs.Redrive(js, build), RedriveAfter: 50 * time.Millisecond}
	// MaxDeliver 1: the broker never delivers the job again, so only a
	// re-drive can finish the released action.
	b = setup(t, jetstream.ConsumerConfig{MaxDeliver: 1}, once.Config{Kinds: map[string]once.KindPolicy{"charge": pol}})
	w := b.worker(t, natsjs.Config{})
	consume(t, w, b.cons, charge(b.client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		if a.Number == 1 {
			return "", errors.New("connection reset after the request was sent")
		}
		return "ch_1", nil
	}))
	j := job{ID: "order-5", Customer: "cus_5", Amount: 500}
	b.publish(t, j)
	first := b.log.waitSettle(t, "the first delivery settled", func(s settle) bool { return s.seq == 1 })
	// Released, on the consumer's only delivery: terminated, and said so.
	if first.d.Action != once.JobDrop || !errors.Is(first.err, once.ErrOutcomeUnknown) || !errors.Is(first.err, natsjs.ErrLastDelivery) {
		t.Fatalf("first delivery settled %v (%v); want an unknown outcome released on the last delivery, terminated", first.d.Action, first.err)
	}

	reaper, err := once.NewReaper(b.client, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	waitFor(t, 20*time.Second, func() bool {
		rep, err := reaper.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Redriven == 1
	}, "the reaper to re-drive the released action")

	again := b.log.waitSettle(t, "the re-driven job settled", func(s settle) bool { return s.seq == 2 })
	if again.d.Action != once.JobAck || again.err != nil {
		t.Fatalf("the re-driven job settled %v (%v); want ack", again.d.Action, again.err)
	}
	b.settledAll(t, 2)
	_, deliveries, effects := b.log.snapshot()
	if len(effects) != 2 || effects[0].Number != 1 || effects[1].Number != 2 {
		t.Fatalf("effects %+v; want attempts 1 and 2", effects)
	}
	if effects[0].ProviderKey == "" || effects[0].ProviderKey != effects[1].ProviderKey {
		t.Fatalf("provider keys %q and %q; want the same key on both attempts", effects[0].ProviderKey, effects[1].ProviderKey)
	}
	key, _, _ := once.KeyOf(j.intent())
	if want := string(key) + "/1/"; !strings.HasPrefix(deliveries[1].msgID, want) {
		t.Fatalf("the re-driven message has Nats-Msg-Id %q; want one that starts %q", deliveries[1].msgID, want)
	}
	a, err := b.client.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != once.StatusSucceeded || a.Attempt != 2 {
		t.Fatalf("action %s at attempt %d; want succeeded at 2", a.Status, a.Attempt)
	}
	// Claimed now: the next pass has nothing to re-drive.
	if rep, err := reaper.RunOnce(ctx); err != nil || rep.Redriven != 0 {
		t.Fatalf("next pass re-drove %d (%v); want none", rep.Redriven, err)
	}
}

func TestRedriveMsgID(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	s := natstest.Stream(t, js, jetstream.StreamConfig{Duplicates: time.Minute})
	subject := s.CachedInfo().Config.Name + ".jobs"
	ctx := context.Background()
	// The original job went out with its own id, as publishers set one
	// to absorb their own retries.
	if _, err := js.Publish(ctx, subject, []byte(`{"id":"order-6"}`), jetstream.WithMsgID("order-6")); err != nil {
		t.Fatal(err)
	}
	redrive := natsjs.Redrive(js, func(a once.Action) (*nats.Msg, error) {
		m := nats.NewMsg(subject)
		m.Data = []byte(`{"id":"` + a.Run + `"}`)
		m.Header.Set(jetstream.MsgIDHeader, a.Run) // replaced by the re-drive's id
		return m, nil
	})
	msgs := func() uint64 {
		i, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return i.State.Msgs
	}
	a := once.Action{Key: once.Key(strings.Repeat("ab", 32)), Run: "order-6", Attempt: 1}
	for range 2 {
		if err := redrive(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if n := msgs(); n != 2 {
		t.Fatalf("the stream holds %d messages after two re-drives of attempt 1; want 2 (the job, and one re-drive: not swallowed by the job's id, the second absorbed)", n)
	}
	a.Attempt = 2
	if err := redrive(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n := msgs(); n != 3 {
		t.Fatalf("the stream holds %d messages after re-driving attempt 2; want 3", n)
	}
	got, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	if id := got.Header.Get(jetstream.MsgIDHeader); id != natsjs.RedriveMsgID(a) || id != string(a.Key)+"/2" {
		t.Fatalf("re-drive published with Nats-Msg-Id %q; want %q", id, string(a.Key)+"/2")
	}

	for name, tc := range map[string]struct {
		js    jetstream.JetStream
		build func(once.Action) (*nats.Msg, error)
		want  string
	}{
		"nil js":      {nil, func(once.Action) (*nats.Msg, error) { return nats.NewMsg(subject), nil }, "nil jetstream.JetStream"},
		"nil build":   {js, nil, "nil build function"},
		"build fails": {js, func(once.Action) (*nats.Msg, error) { return nil, errors.New("no such order") }, "no such order"},
		"no message":  {js, func(once.Action) (*nats.Msg, error) { return nil, nil }, "without a subject"},
		"no subject":  {js, func(once.Action) (*nats.Msg, error) { return &nats.Msg{}, nil }, "without a subject"},
		"no stream":   {js, func(once.Action) (*nats.Msg, error) { return nats.NewMsg("nowhere." + subject), nil }, "publishing to"},
	} {
		err := natsjs.Redrive(tc.js, tc.build)(ctx, a)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", name, err, tc.want)
		}
	}
}

func TestConnectionLostMidEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{AckWait: time.Second}, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: 2 * time.Second}}})

	// Worker A on a connection of its own, which the test cuts while
	// A's effect runs.
	ncA, err := nats.Connect(natstest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer ncA.Close()
	jsA, err := jetstream.New(ncA)
	if err != nil {
		t.Fatal(err)
	}
	consA, err := jsA.Consumer(context.Background(), b.stream, "worker")
	if err != nil {
		t.Fatal(err)
	}
	logA := &record{}
	started := make(chan struct{})
	release := make(chan struct{})
	start := closer(started)
	effect := func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		start()
		<-release
		return "ch_1", nil
	}
	runA := consume(t, workerOn(t, jsA, natsjs.Config{}, logA), consA, charge(b.client, logA, effect))
	b.publish(t, job{ID: "order-7", Customer: "cus_7", Amount: 700})
	<-started
	ncA.Close()

	// Worker B gets the message after AckWait; A's claim answers it.
	consume(t, b.worker(t, natsjs.Config{}), b.cons, charge(b.client, b.log, effect))
	nak := b.log.waitSettle(t, "B handed the job back", func(s settle) bool { return s.d.Action == once.JobRetry })
	if !errors.Is(nak.err, once.ErrInFlight) {
		t.Fatalf("B's delivery settled with %v; want ErrInFlight", nak.err)
	}
	close(release)

	// A records the effect but cannot ack; it says so.
	ack := logA.waitSettle(t, "A's settlement", func(settle) bool { return true })
	if ack.d.Action != once.JobAck || !errors.Is(ack.err, natsjs.ErrNotSettled) {
		t.Fatalf("A settled %v with %v; want an ack that was not settled", ack.d.Action, ack.err)
	}
	if err := runA.stop(); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("A's Consume returned %v; want the error that stopped it", err)
	}
	// B's next delivery replays the result and acks.
	replay := b.log.waitSettle(t, "B acked", func(s settle) bool { return s.d.Action == once.JobAck })
	if replay.err != nil {
		t.Fatal(replay.err)
	}
	b.settledAll(t, 1)
	if _, _, effects := b.log.snapshot(); len(effects) != 1 {
		t.Fatalf("the effect ran %d times; want once", len(effects))
	}
	if _, deliveries, _ := b.log.snapshot(); !deliveries[len(deliveries)-1].replayed {
		t.Fatal("B's last delivery was not a replay")
	}
}

func TestShutdown(t *testing.T) {
	t.Parallel()
	t.Run("cancelled job handed back at once", func(t *testing.T) {
		t.Parallel()
		b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
		started := make(chan struct{}, 1)
		c := consume(t, b.worker(t, natsjs.Config{DrainTimeout: 100 * time.Millisecond}), b.cons,
			charge(b.client, b.log, func(ctx context.Context, a once.Attempt) (string, error) {
				b.log.effect(a)
				started <- struct{}{}
				<-ctx.Done() // runs past the drain time
				return "", once.RetryLater(ctx.Err())
			}))
		b.publish(t, job{ID: "order-8", Customer: "cus_8", Amount: 800})
		<-started
		if err := c.stop(); err != nil {
			t.Fatalf("Consume returned %v; want nil after a graceful stop", err)
		}
		s := b.log.waitSettle(t, "the job handed back", func(settle) bool { return true })
		if s.d.Action != once.JobRetry || s.d.After != 0 || !errors.Is(s.err, once.ErrRetryLater) {
			t.Fatalf("settled %v after %v (%v); want a retry at once (Nak)", s.d.Action, s.d.After, s.err)
		}
		// Another worker takes it and runs it.
		consume(t, b.worker(t, natsjs.Config{}), b.cons, charge(b.client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
			b.log.effect(a)
			return "ch_1", nil
		}))
		done := b.log.waitSettle(t, "the job done by the next worker", func(s settle) bool { return s.d.Action == once.JobAck })
		b.settledAll(t, 1)
		// (The server's delivery count is no witness here: a Nak'd
		// message offered to the stopped worker's expired pull request
		// has its count taken back.)
		if _, _, effects := b.log.snapshot(); len(effects) != 2 || effects[1].Number != 2 || done.err != nil {
			t.Fatalf("effects %+v, settled with %v; want attempt 2 run by the next worker", effects, done.err)
		}
	})
	t.Run("running job finishes within the drain time", func(t *testing.T) {
		t.Parallel()
		b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
		started := make(chan struct{})
		release := make(chan struct{})
		start := closer(started)
		c := consume(t, b.worker(t, natsjs.Config{DrainTimeout: time.Minute}), b.cons,
			charge(b.client, b.log, func(ctx context.Context, a once.Attempt) (string, error) {
				b.log.effect(a)
				start()
				<-release
				// The job's context outlives Consume's for the drain time.
				return "ch_1", ctx.Err()
			}))
		b.publish(t, job{ID: "order-9", Customer: "cus_9", Amount: 900})
		<-started
		c.cancel() // the worker is told to stop while the job runs
		close(release)
		if err := c.stop(); err != nil {
			t.Fatal(err)
		}
		s := b.log.waitSettle(t, "the job settled", func(settle) bool { return true })
		if s.d.Action != once.JobAck || s.err != nil {
			t.Fatalf("settled %v (%v); want ack: the job finished while the worker drained", s.d.Action, s.err)
		}
		b.settledAll(t, 1)
	})
	t.Run("Handle after the context ended does not run the job", func(t *testing.T) {
		t.Parallel()
		b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
		b.publish(t, job{ID: "order-10", Customer: "cus_10", Amount: 1000})
		msg, err := b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		ran := false
		d, err := b.worker(t, natsjs.Config{}).Handle(ctx, msg, func(context.Context, jetstream.Msg) error { ran = true; return nil })
		if ran || d.Action != once.JobRetry || err == nil || !strings.Contains(err.Error(), "stopping") {
			t.Fatalf("ran %v, settled %v (%v); want not run, handed back", ran, d.Action, err)
		}
		// Handed back with a Nak: delivered again at once.
		again, err := b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("the message was not handed back: %v", err)
		}
		if m, _ := again.Metadata(); m.NumDelivered != 2 {
			t.Fatalf("delivery %d; want 2", m.NumDelivered)
		}
		again.Ack()
	})
}

func TestConsumeStopsWhenConsumerDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
	w := b.worker(t, natsjs.Config{})
	done := make(chan error, 1)
	go func() {
		done <- w.Consume(context.Background(), b.cons, func(context.Context, jetstream.Msg) error { return nil })
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Let Consume subscribe first: its pull request then meets the
	// deletion.
	waitFor(t, 10*time.Second, func() bool { return b.info(t).NumWaiting > 0 }, "Consume's pull request")
	if err := b.js.DeleteConsumer(ctx, b.stream, "worker"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "stopped") {
			t.Fatalf("Consume returned %v; want an error saying the consumer stopped", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Consume did not return after its consumer was deleted")
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	if _, err := natsjs.New(nil, natsjs.Config{}); err == nil || !strings.Contains(err.Error(), "jetstream.JetStream") {
		t.Errorf("New(nil): %v", err)
	}
	_, js := natstest.Connect(t)
	for _, cfg := range []natsjs.Config{
		{Progress: -1}, {Concurrency: -1}, {RetryDelay: time.Minute, MaxRetryDelay: time.Second},
	} {
		if _, err := natsjs.New(js, cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
	w, err := natsjs.New(js, natsjs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Handle(context.Background(), nil, func(context.Context, jetstream.Msg) error { return nil }); err == nil {
		t.Error("Handle(nil message): no error")
	}
	if err := w.Consume(context.Background(), nil, func(context.Context, jetstream.Msg) error { return nil }); err == nil {
		t.Error("Consume(nil consumer): no error")
	}
	// A consumer that acks all before a message would let one job's ack
	// settle the jobs still running before it.
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
	ctx := context.Background()
	all, err := js.CreateConsumer(ctx, b.stream, jetstream.ConsumerConfig{Durable: "all", AckPolicy: jetstream.AckAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Consume(ctx, all, func(context.Context, jetstream.Msg) error { return nil }); err == nil || !strings.Contains(err.Error(), "AckExplicitPolicy") {
		t.Errorf("Consume on an AckAll consumer: %v; want an error naming AckExplicitPolicy", err)
	}
	var nilW *natsjs.Worker
	if _, err := nilW.Handle(context.Background(), nil, nil); err == nil {
		t.Error("nil worker: no error")
	}
}
