package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// A reaper holds an action while it decides, and a duplicate that meets
// the hold is told to come back when the hold runs out. The hold is the
// action's own kind's (a lease of 10 s here), not the longest of every
// policy's (Config.Default's 2 minutes): a delivery of a job whose kind
// set 10 s must not be sent away for minutes by a decision that takes a
// moment.
func testReaperHoldsForTheKind(t *testing.T, h Harness) {
	const lease = 10 * time.Second
	kinds := map[string]once.KindPolicy{"send_email": {Lease: lease}, "post_message": {Lease: lease, Recovery: once.RetryWithProviderKey}}
	entered, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	cfg := once.Config{Kinds: kinds}
	cfg.Hooks.OnEvent = func(_ context.Context, o once.Observation) {
		// The reaper took the action and is about to decide: it holds it.
		if o.Type == once.EventLeaseExpired && o.Actor == once.ActorReaper {
			first.Do(func() {
				close(entered)
				<-release
			})
		}
	}
	s, reaping, spec := setup(t, h, cfg)
	other, err := h.Open(ctx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore(other) })
	worker, err := once.New(once.Config{Store: other, Kinds: kinds})
	if err != nil {
		t.Fatal(err)
	}
	in := intent(1)
	mustClaim(t, s, claimReq(t, in, time.Millisecond))
	time.Sleep(20 * time.Millisecond)

	r, err := once.NewReaper(reaping, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	type pass struct {
		rep once.ReapReport
		err error
	}
	done := make(chan pass, 1)
	go func() {
		rep, err := r.RunOnce(ctx(t))
		done <- pass{rep, err}
	}()
	select {
	case <-entered:
	case p := <-done:
		t.Fatalf("the reaper finished (%+v, %v) without taking the action", p.rep, p.err)
	}
	_, err = once.Do(ctx(t), worker, in, func(context.Context, once.Attempt) (int, error) {
		t.Error("a duplicate ran the effect while the reaper held the action")
		return 0, nil
	})
	close(release)
	var held *once.InFlightError
	if !errors.As(err, &held) {
		t.Fatalf("duplicate = %v, want *InFlightError while the reaper holds it", err)
	}
	// The stored hold is the kind's lease, by the database's clock; a
	// second allows for the clocks and the time since the hold was taken.
	if away := time.Until(held.LeaseUntil); away > lease+time.Second {
		t.Errorf("the duplicate is told the hold runs out %v from now (LeaseUntil %v); want at most the kind's lease, %v",
			away.Round(time.Second), held.LeaseUntil, lease)
	}
	if d := once.Dispose(err); d.Action != once.JobRetry || d.After > lease+time.Second {
		t.Errorf("Dispose = %s after %v (%s); want a retry within the kind's lease, %v", d.Action, d.After.Round(time.Second), d.Reason, lease)
	}
	p := <-done
	if p.err != nil || p.rep.Review != 1 {
		t.Fatalf("reaper = %+v, %v; want the dead claim put up for review", p.rep, p.err)
	}
	if a := mustGet(t, s, keyOf(t, in)); a.Status != once.StatusReview {
		t.Fatalf("stored %s, want review", a.Status)
	}
}

// RecoverRequest.KindHolds holds each taken action for its own kind's
// hold, by the database's clock, in a batch and by key; the kinds it does
// not name take Hold.
func testRecoverableKindHolds(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	const short = 10 * time.Second
	email := intent(1)
	other := once.Intent{Run: "run-1", Step: 2, Kind: "post_message"}
	byKey := once.Intent{Run: "run-1", Step: 3, Kind: "send_email"}
	for _, in := range []once.Intent{email, other, byKey} {
		mustClaim(t, s, claimReq(t, in, time.Millisecond))
	}
	time.Sleep(20 * time.Millisecond)
	holds := map[string]time.Duration{"send_email": short, "charge_card": time.Minute}
	check := func(got []once.Action, now time.Time) {
		t.Helper()
		for _, a := range got {
			want := time.Hour
			if a.Kind == "send_email" {
				want = short
			}
			if d := a.LeaseUntil.Sub(now); d < want-time.Second || d > want+time.Second {
				t.Errorf("%s (%s) held %v past the database's now, want %v", a.Key, a.Kind, d, want)
			}
			if stored := mustGet(t, s, a.Key); !stored.LeaseUntil.Equal(a.LeaseUntil) {
				t.Errorf("%s stored with lease %v, handed out with %v", a.Key, stored.LeaseUntil, a.LeaseUntil)
			}
		}
	}
	got, now, err := s.Recoverable(ctx(t), once.RecoverRequest{Key: keyOf(t, byKey), Limit: 1, Hold: time.Hour, KindHolds: holds, Token: "k"})
	if err != nil || len(got) != 1 {
		t.Fatalf("Recoverable by key = %d actions, %v; want one", len(got), err)
	}
	check(got, now)
	got, now, err = s.Recoverable(ctx(t), once.RecoverRequest{Limit: 10, Hold: time.Hour, KindHolds: holds, Token: "b"})
	if err != nil || len(got) != 2 {
		t.Fatalf("Recoverable = %d actions, %v; want two", len(got), err)
	}
	check(got, now)
}
