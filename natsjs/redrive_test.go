package natsjs_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/brokertest/natstest"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/natsjs"
)

// TestRedriveAgainWithinDuplicateWindow re-drives a released action whose
// first re-drive was delivered but never claimed: the worker that got it
// could not reach its database, and the consumer's MaxDeliver was spent.
// The reaper re-drives it again after RedriveAfter, within the stream's
// duplicate window; that re-drive must reach the stream, not be taken for
// a retry of the first and swallowed while the reaper counts it re-driven.
func TestRedriveAgainWithinDuplicateWindow(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	var subject string
	build := func(a once.Action) (*nats.Msg, error) {
		j, err := jobOf(a)
		if err != nil {
			return nil, err
		}
		data, err := json.Marshal(j)
		return &nats.Msg{Subject: subject, Data: data}, err
	}
	pol := once.KindPolicy{Recovery: once.RetryWithProviderKey, Redrive: natsjs.Redrive(js, build), RedriveAfter: 50 * time.Millisecond}
	oc := once.Config{Kinds: map[string]once.KindPolicy{"charge": pol}}
	s := natstest.Stream(t, js, jetstream.StreamConfig{Duplicates: time.Minute})
	stream := s.CachedInfo().Config.Name
	subject = stream + ".jobs"
	ctx := context.Background()
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 1})
	if err != nil {
		t.Fatal(err)
	}
	client, _ := testdb.SQLiteClient(t, oc)
	// down is a worker's client whose database is gone.
	oc.ClaimTimeout = 200 * time.Millisecond
	down, downStore := testdb.SQLiteClient(t, oc)
	downStore.Close()
	log := &record{}
	w := workerOn(t, js, natsjs.Config{}, log)
	next := func(what string) jetstream.Msg {
		t.Helper()
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("%s never came: %v", what, err)
		}
		return msg
	}
	j := job{ID: "order-rd", Customer: "cus_rd", Amount: 3}
	data, _ := json.Marshal(j)
	if _, err := js.Publish(ctx, subject, data); err != nil {
		t.Fatal(err)
	}
	d, err := w.Handle(ctx, next("the job"), charge(client, log, func(context.Context, once.Attempt) (string, error) {
		return "", errors.New("connection reset after the request was sent")
	}))
	if d.Action != once.JobDrop || !errors.Is(err, once.ErrRetryLater) || !errors.Is(err, natsjs.ErrLastDelivery) {
		t.Fatalf("first delivery settled %v (%v); want a released action on the last delivery, terminated", d.Action, err)
	}

	reaper, err := once.NewReaper(client, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	redrive := func() {
		t.Helper()
		waitFor(t, 20*time.Second, func() bool {
			rep, err := reaper.RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return rep.Redriven == 1
		}, "the reaper to re-drive the released action")
	}
	redrive()
	d, err = w.Handle(ctx, next("the first re-drive"), charge(down, log, func(context.Context, once.Attempt) (string, error) {
		t.Error("the effect ran on a worker without its database")
		return "", nil
	}))
	if d.Action != once.JobDrop || !errors.Is(err, natsjs.ErrLastDelivery) {
		t.Fatalf("the first re-drive settled %v (%v); want it terminated on its last delivery: the worker's database is gone", d.Action, err)
	}
	key, _, _ := once.KeyOf(j.intent())
	if a, err := client.Get(ctx, key); err != nil || a.Status != once.StatusReleased || a.Attempt != 1 {
		t.Fatalf("action %s at attempt %d (%v); want still released at 1", a.Status, a.Attempt, err)
	}

	redrive()
	if i, err := s.Info(ctx); err != nil || i.State.Msgs != 3 {
		t.Fatalf("the stream holds %d messages (%v) after the reaper reported a second re-drive; want 3: the job and two re-drives", i.State.Msgs, err)
	}
	d, err = w.Handle(ctx, next("the second re-drive"), charge(client, log, func(context.Context, once.Attempt) (string, error) {
		return "ch_1", nil
	}))
	if d.Action != once.JobAck || err != nil {
		t.Fatalf("the second re-drive settled %v (%v); want ack", d.Action, err)
	}
	if a, err := client.Get(ctx, key); err != nil || a.Status != once.StatusSucceeded || a.Attempt != 2 {
		t.Fatalf("action %s at attempt %d (%v); want succeeded at 2", a.Status, a.Attempt, err)
	}
}
