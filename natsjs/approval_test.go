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
	"github.com/oncehq/once/natsjs"
)

// overLimit is an approval policy for charge jobs: a charge over 1000
// waits for a person, for expiry.
func overLimit(expiry time.Duration) once.ApprovalPolicy {
	return once.ApprovalPolicy{Expiry: expiry, When: func(in once.Intent) bool { return in.Payload.(map[string]int)["amount"] > 1000 }}
}

// next takes the consumer's next message, or fails the test.
func (b *bundle) next(t *testing.T, what string) jetstream.Msg {
	t.Helper()
	msg, err := b.cons.Next(jetstream.FetchMaxWait(20 * time.Second))
	if err != nil {
		t.Fatalf("%s never came: %v", what, err)
	}
	return msg
}

// counted is a charge job function whose effect counts itself in b.log.
func (b *bundle) counted() natsjs.JobFunc {
	return charge(b.client, b.log, func(_ context.Context, a once.Attempt) (string, error) {
		b.log.effect(a)
		return "ch_1", nil
	})
}

func (b *bundle) effects() int {
	_, _, effects := b.log.snapshot()
	return len(effects)
}

func (b *bundle) approve(t *testing.T, j job) {
	t.Helper()
	key, _, err := once.KeyOf(j.intent())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Approve(context.Background(), key, once.Approval{By: "ada"}); err != nil {
		t.Fatal(err)
	}
}

// TestApprovalNakedUntilApproved: a charge over the limit, on a kind with
// no Redrive hook, is not run: its message is handed back with a delay
// (NakWithDelay), not terminated as unknown or poison. Once a person
// approves it, the message's next delivery runs the charge, once, and a
// duplicate of the job replays it.
func TestApprovalNakedUntilApproved(t *testing.T) {
	t.Parallel()
	// The wait is short, so the delay (a minute at most, or just past the
	// expiry) brings the message back within the test.
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Approval: overLimit(5 * time.Second)}}})
	w := b.worker(t, natsjs.Config{})
	j := job{ID: "order-ap", Customer: "cus_ap", Amount: 2500}
	b.publish(t, j)
	first := b.next(t, "the job")
	d, err := w.Handle(context.Background(), first, b.counted())
	if d.Action != once.JobRetry || d.After <= 0 || !errors.Is(err, once.ErrAwaitingApproval) || errors.Is(err, natsjs.ErrNotSettled) {
		t.Fatalf("a job awaiting approval settled %v after %v (%v); want NakWithDelay, with ErrAwaitingApproval", d.Action, d.After, err)
	}
	if n := b.effects(); n != 0 {
		t.Fatalf("the charge ran %d times before anyone approved it", n)
	}
	b.approve(t, j)

	again := b.next(t, "the message handed back")
	if m, _ := again.Metadata(); m.Sequence.Stream != 1 || m.NumDelivered != 2 {
		t.Fatalf("got stream message %d, delivery %d; want the job's message again", m.Sequence.Stream, m.NumDelivered)
	}
	if d, err := w.Handle(context.Background(), again, b.counted()); d.Action != once.JobAck || err != nil {
		t.Fatalf("the delivery after approval settled %v (%v); want ack", d.Action, err)
	}
	b.publish(t, j)
	if d, err := w.Handle(context.Background(), b.next(t, "the duplicate"), b.counted()); d.Action != once.JobAck || err != nil {
		t.Fatalf("a duplicate after the run settled %v (%v); want ack", d.Action, err)
	}
	if _, deliveries, effects := b.log.snapshot(); len(effects) != 1 || !deliveries[len(deliveries)-1].replayed {
		t.Fatalf("the charge ran %d times; want once, and the duplicate replayed", len(effects))
	}
	b.settledAll(t, 2)
}

// TestApprovalTerminatedThenRedriven: on a kind with a Redrive hook, a
// job awaiting approval is terminated at once (nothing goes round the
// consumer for the length of the wait). Once approved, the reaper hands
// the action to the hook after RedriveAfter; the job it publishes runs
// the charge, once.
func TestApprovalTerminatedThenRedriven(t *testing.T) {
	t.Parallel()
	// The hook publishes on the test's stream, which setup makes.
	var b *bundle
	build := func(a once.Action) (*nats.Msg, error) {
		j, err := jobOf(a)
		if err != nil {
			return nil, err
		}
		data, err := json.Marshal(j)
		return &nats.Msg{Subject: b.subject, Data: data}, err
	}
	hook := func(ctx context.Context, a once.Action) error { return natsjs.Redrive(b.js, build)(ctx, a) }
	pol := once.KindPolicy{Approval: overLimit(time.Hour), Redrive: hook, RedriveAfter: 50 * time.Millisecond}
	b = setup(t, jetstream.ConsumerConfig{}, once.Config{Kinds: map[string]once.KindPolicy{"charge": pol}})
	w := b.worker(t, natsjs.Config{})
	j := job{ID: "order-rd", Customer: "cus_rd", Amount: 5000}
	b.publish(t, j)
	d, err := w.Handle(context.Background(), b.next(t, "the job"), b.counted())
	if d.Action != once.JobDrop || !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("a job awaiting approval, on a kind that re-drives, settled %v (%v); want terminated", d.Action, err)
	}
	if _, err := b.cons.Next(jetstream.FetchMaxWait(time.Second)); err == nil {
		t.Fatal("the terminated job was delivered again")
	}
	b.approve(t, j)
	reaper, err := once.NewReaper(b.client, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool {
		rep, err := reaper.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return rep.Redriven == 1
	}, "the reaper to re-drive the approved action")
	redriven := b.next(t, "the re-drive")
	if id := redriven.Headers().Get(jetstream.MsgIDHeader); id == "" {
		t.Fatal("the re-drive carries no Nats-Msg-Id")
	}
	if d, err := w.Handle(context.Background(), redriven, b.counted()); d.Action != once.JobAck || err != nil {
		t.Fatalf("the re-drive settled %v (%v); want ack", d.Action, err)
	}
	if n := b.effects(); n != 1 {
		t.Fatalf("the charge ran %d times; want once", n)
	}
	time.Sleep(100 * time.Millisecond) // past RedriveAfter
	if rep, err := reaper.RunOnce(context.Background()); err != nil || rep.Redriven != 0 || rep.Waiting != 0 {
		t.Fatalf("a pass after the charge ran: %+v, %v; want nothing to re-drive", rep, err)
	}
}

// TestApprovalLastDeliveryWaits: a job awaiting approval on its
// consumer's last delivery (MaxDeliver 1), on a kind with no Redrive
// hook, is terminated with ErrLastDelivery. Once approved, nothing
// brings it back: the reaper counts the action as waiting, and it runs,
// once, when the job is published again.
func TestApprovalLastDeliveryWaits(t *testing.T) {
	t.Parallel()
	pol := once.KindPolicy{Approval: overLimit(time.Hour), RedriveAfter: 50 * time.Millisecond}
	b := setup(t, jetstream.ConsumerConfig{MaxDeliver: 1}, once.Config{Kinds: map[string]once.KindPolicy{"charge": pol}})
	w := b.worker(t, natsjs.Config{})
	j := job{ID: "order-md", Customer: "cus_md", Amount: 9000}
	b.publish(t, j)
	d, err := w.Handle(context.Background(), b.next(t, "the job"), b.counted())
	if d.Action != once.JobDrop || !errors.Is(err, once.ErrAwaitingApproval) || !errors.Is(err, natsjs.ErrLastDelivery) {
		t.Fatalf("awaiting approval on the last delivery: settled %v (%v); want terminated, with ErrLastDelivery", d.Action, err)
	}
	b.approve(t, j)
	reaper, err := once.NewReaper(b.client, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool {
		rep, err := reaper.RunOnce(context.Background())
		if err != nil || rep.Redriven != 0 {
			t.Fatalf("reaper pass %+v, %v; want nothing re-driven: the kind has no hook", rep, err)
		}
		return rep.Waiting == 1
	}, "the reaper to count the approved action as waiting")
	if n := b.effects(); n != 0 {
		t.Fatalf("the charge ran %d times with no delivery", n)
	}
	b.publish(t, j)
	if d, err := w.Handle(context.Background(), b.next(t, "the job published again"), b.counted()); d.Action != once.JobAck || err != nil {
		t.Fatalf("the job published again settled %v (%v); want ack", d.Action, err)
	}
	if n := b.effects(); n != 1 {
		t.Fatalf("the charge ran %d times; want once", n)
	}
}

// TestApprovalExpiredTerminated: the delays end with the wait. A job
// whose wait expired unanswered is terminated on its next delivery, not
// handed back again, and never runs.
func TestApprovalExpiredTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{Kinds: map[string]once.KindPolicy{"charge": {Approval: overLimit(time.Second)}}})
	w := b.worker(t, natsjs.Config{})
	b.publish(t, job{ID: "order-ex", Customer: "cus_ex", Amount: 1001})
	if d, err := w.Handle(context.Background(), b.next(t, "the job"), b.counted()); d.Action != once.JobRetry || !errors.Is(err, once.ErrAwaitingApproval) {
		t.Fatalf("first delivery settled %v (%v); want a retry while it awaits approval", d.Action, err)
	}
	d, err := w.Handle(context.Background(), b.next(t, "the delivery after the expiry"), b.counted())
	var aw *once.AwaitingApprovalError
	if d.Action != once.JobDrop || !errors.As(err, &aw) || !aw.Expired {
		t.Fatalf("the delivery after the wait expired settled %v (%v); want terminated, the wait expired", d.Action, err)
	}
	if n := b.effects(); n != 0 {
		t.Fatalf("the charge ran %d times; nobody approved it", n)
	}
	b.settledAll(t, 1)
}
