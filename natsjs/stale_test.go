package natsjs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/faultproxy"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/natsjs"
	"github.com/oncehq/once/postgres"
)

// pgClients returns two once clients on one fresh PostgreSQL schema: one
// reaches it through a fault proxy (a worker whose database connection
// can hang), the other directly. The schema is dropped when the test
// ends.
func pgClients(t *testing.T, cfg once.Config) (proxied, direct *once.Client, p *faultproxy.Proxy) {
	t.Helper()
	url := testdb.RequirePostgres(t)
	pc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var r [6]byte
	rand.Read(r[:])
	schema := "once_natsjs_" + hex.EncodeToString(r[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	open := func(u string) *postgres.Store {
		s, err := testdb.RetryTooManyClients(ctx, func() (*postgres.Store, error) { return postgres.Open(ctx, u, postgres.Config{Schema: schema}) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	ds := open(fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&pool_max_conns=2", pc.User, pc.Host, pc.Port, pc.Database))
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	if err := ds.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	p, err = faultproxy.Start(fmt.Sprintf("%s:%d", pc.Host, pc.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ps := open(fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&pool_max_conns=2", pc.User, p.Addr(), pc.Database))
	cfg.Store = ps
	if proxied, err = once.New(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Store = ds
	if direct, err = once.New(cfg); err != nil {
		t.Fatal(err)
	}
	return proxied, direct, p
}

// TestSupersededDeliveryKeepsNewerAttempt pauses a worker (A) past its
// claim's lease and the consumer's AckWait: its InProgress signals and
// heartbeats stop. The message goes to worker B, whose Do takes the
// lapsed claim over (RetryWithProviderKey) and runs attempt 2. A then
// comes back, its effect returns success, and its record is fenced out.
// JetStream settles a message, not a delivery: an ack of A's stale
// delivery would settle B's too, and when B's attempt ends released
// (the provider said retry later), B's Nak finds nothing to hand back.
// The released action must still have a delivery coming.
func TestSupersededDeliveryKeepsNewerAttempt(t *testing.T) {
	t.Parallel()
	oc := once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: time.Second, Recovery: once.RetryWithProviderKey}}}
	clientA, clientB, proxy := pgClients(t, oc)
	b := setup(t, jetstream.ConsumerConfig{AckWait: time.Second}, once.Config{})
	j := job{ID: "order-stale", Customer: "cus_s", Amount: 1}
	b.publish(t, j)

	// A is the paused worker: it sends no InProgress while paused.
	logA := &record{}
	wA := workerOn(t, b.js, natsjs.Config{Progress: time.Hour}, logA)
	startedA, releaseA := make(chan struct{}), make(chan struct{})
	msgA, err := b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	type handled struct {
		d   once.Disposition
		err error
	}
	doneA := make(chan handled, 1)
	go func() {
		d, err := wA.Handle(context.Background(), msgA, charge(clientA, logA, func(_ context.Context, a once.Attempt) (string, error) {
			b.log.effect(a)
			close(startedA)
			<-releaseA // the call is out while the process is paused
			return "ch_A", nil
		}))
		doneA <- handled{d, err}
	}()
	<-startedA
	proxy.Blackout(true) // A's heartbeats hang from here

	// B takes every delivery until its own attempt runs.
	wB := b.worker(t, natsjs.Config{})
	startedB, releaseB := make(chan struct{}), make(chan struct{})
	var startB sync.Once
	fnB := charge(clientB, b.log, func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		startB.Do(func() { close(startedB) })
		<-releaseB
		return "", once.RetryLater(errors.New("429 from the provider"))
	})
	doneB := make(chan handled, 1)
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			msg, err := b.cons.Next(jetstream.FetchMaxWait(2 * time.Second))
			if err != nil {
				continue
			}
			ran := false
			d, err := wB.Handle(context.Background(), msg, func(ctx context.Context, msg jetstream.Msg) error {
				err := fnB(ctx, msg)
				select {
				case <-startedB:
					ran = true
				default:
				}
				return err
			})
			if ran {
				doneB <- handled{d, err}
				return
			}
		}
		doneB <- handled{err: errors.New("B never ran its attempt")}
	}()
	select {
	case <-startedB:
	case <-time.After(30 * time.Second):
		t.Fatal("B never took the lapsed claim over")
	}

	// A comes back: its effect returns, its record is fenced out.
	proxy.Blackout(false)
	proxy.Reset()
	close(releaseA)
	a := <-doneA
	if !errors.Is(a.err, once.ErrFenced) {
		t.Fatalf("A settled %v (%v); want its outcome fenced out", a.d.Action, a.err)
	}
	// B's attempt ends released: it needs another delivery.
	close(releaseB)
	bRes := <-doneB
	if bRes.d.Action != once.JobRetry || !errors.Is(bRes.err, once.ErrRetryLater) {
		t.Fatalf("B settled %v (%v); want a retry of a released action", bRes.d.Action, bRes.err)
	}
	key, _, _ := once.KeyOf(j.intent())
	if act, err := clientB.Get(context.Background(), key); err != nil || act.Status != once.StatusReleased || act.Attempt != 2 {
		t.Fatalf("action %s at attempt %d (%v); want released at 2", act.Status, act.Attempt, err)
	}

	// The job comes back and the released action runs.
	msg, err := b.cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("the released action's job never came back (%v): A's stale delivery settled the message (%v) under B's attempt", err, a.d.Action)
	}
	d, err := wB.Handle(context.Background(), msg, charge(clientB, b.log, func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		return "ch_3", nil
	}))
	if d.Action != once.JobAck || err != nil {
		t.Fatalf("the job's next delivery settled %v (%v); want ack", d.Action, err)
	}
	if act, err := clientB.Get(context.Background(), key); err != nil || act.Status != once.StatusSucceeded {
		t.Fatalf("action %s (%v); want succeeded", act.Status, err)
	}
	if _, _, effects := b.log.snapshot(); len(effects) != 3 {
		t.Fatalf("%d effect calls; want 3 (A's, B's, and the one after the release)", len(effects))
	}
}
