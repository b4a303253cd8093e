package natsjs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncehq/once"
	"github.com/oncehq/once/internal/testdb"
	"github.com/oncehq/once/natsjs"
)

// A delivery that meets an action a reaper is deciding is sent back for
// the hold of the action's own kind (its lease, 10 s), not for the
// longest hold of every policy (Config.Default's 2 minutes), over a real
// JetStream consumer: the delay Handle naks with is the value asserted.
func TestDeliveryMeetingAReaperHoldWaitsForItsKind(t *testing.T) {
	t.Parallel()
	const lease = 10 * time.Second
	entered, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	oc := once.Config{Kinds: map[string]once.KindPolicy{"charge": {Lease: lease}}}
	oc.Hooks.OnEvent = func(_ context.Context, o once.Observation) {
		if o.Type == once.EventLeaseExpired && o.Actor == once.ActorReaper {
			first.Do(func() {
				close(entered)
				<-release
			})
		}
	}
	b := setup(t, jetstream.ConsumerConfig{}, once.Config{})
	client, store := testdb.SQLiteClient(t, oc)
	ctx := context.Background()
	j := job{ID: "order-hold", Customer: "cus_hold", Amount: 7}
	key, fp, err := once.KeyOf(j.intent())
	if err != nil {
		t.Fatal(err)
	}
	// A worker claimed it and died: its lease has lapsed.
	in := j.intent()
	if cr, err := store.Claim(ctx, once.ClaimRequest{Key: key, Fingerprint: fp, Run: in.Run, Kind: in.Kind, Target: in.Target, Lease: time.Millisecond, Token: "dead"}); err != nil || !cr.Claimed {
		t.Fatalf("claim = %+v, %v", cr, err)
	}
	time.Sleep(20 * time.Millisecond)
	reaper, err := once.NewReaper(client, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := reaper.RunOnce(ctx)
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("the reaper finished (%v) without taking the action", err)
	}
	b.publish(t, j)
	msg, err := b.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	d, err := b.worker(t, natsjs.Config{}).Handle(ctx, msg, charge(client, b.log, func(context.Context, once.Attempt) (string, error) {
		t.Error("the delivery ran the effect while the reaper held the action")
		return "", nil
	}))
	close(release)
	if !errors.Is(err, once.ErrInFlight) || d.Action != once.JobRetry {
		t.Fatalf("delivery = %s (%s), %v; want it sent back: the reaper holds the action", d.Action, d.Reason, err)
	}
	if d.After > lease+time.Second {
		t.Errorf("the delivery was sent back for %v; want at most the kind's lease, %v", d.After.Round(time.Second), lease)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
