package storetest

import (
	"context"
	"errors"
	"strings"
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

// Recoverable takes an action whose recorded recovery is among
// Verifiable.Recoveries only for the kinds Verifiable names (Kinds, or
// every kind but Except when Others), in a batch and by key, and any
// other action whatever it names. The store substitutes the values it
// is given; it knows no recovery mode.
func testRecoverableVerifiable(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	claim := func(step int64, kind string, rec once.Recovery) once.Key {
		req := claimReq(t, once.Intent{Run: "verifiable", Step: step, Kind: kind}, time.Millisecond)
		req.Recovery = rec
		mustClaim(t, s, req)
		return req.Key
	}
	mine := claim(1, "mine", once.VerifyThenDecide)
	theirs := claim(2, "theirs", once.VerifyThenDecide)
	person := claim(3, "theirs", once.AskPerson)
	other := claim(4, "other", once.VerifyThenDecide)
	time.Sleep(20 * time.Millisecond)
	only := []string{once.VerifyThenDecide.String()}
	take := func(token string, key once.Key, v once.Verifiable) map[once.Key]bool {
		t.Helper()
		got, _, err := s.Recoverable(ctx(t), once.RecoverRequest{Key: key, Limit: 10, Hold: time.Millisecond, Token: token, Verifiable: v})
		if err != nil {
			t.Fatalf("Recoverable(%+v) = %v", v, err)
		}
		taken := map[once.Key]bool{}
		for _, a := range got {
			taken[a.Key] = true
		}
		// Due again at once, for the next request.
		time.Sleep(20 * time.Millisecond)
		return taken
	}
	if got := take("a", theirs, once.Verifiable{Recoveries: only, Kinds: []string{"mine"}}); len(got) != 0 {
		t.Errorf("Recoverable by key took %v, recorded %s, of a kind it does not name", got, once.VerifyThenDecide)
	}
	if got := take("b", "", once.Verifiable{Recoveries: only, Kinds: []string{"mine"}}); len(got) != 2 || !got[mine] || !got[person] {
		t.Errorf("Recoverable naming kind mine took %v; want %s (its kind named) and %s (recorded %s)", got, mine, person, once.AskPerson)
	}
	if got := take("c", "", once.Verifiable{Recoveries: only, Others: true, Except: []string{"other"}}); len(got) != 3 || got[other] {
		t.Errorf("Recoverable for every kind but other took %v; want all but %s", got, other)
	}
	if got := take("d", "", once.Verifiable{}); len(got) != 4 {
		t.Errorf("Recoverable restricting no recovery took %v; want all four", got)
	}
}

// A Redrive hook may run the action itself with once.Do, instead of
// publishing its job again. Two reapers (two clients, each with its own
// connection) that both find the same released actions waiting hand each
// one to Redrive once between them: only the reaper that marks it calls
// the hook and counts it, and the trail says it was re-driven before the
// hook's own claim. Each effect runs once.
func testRedriveHookRunsDo(t *testing.T, h Harness) {
	const n = 4
	const after = 300 * time.Millisecond
	var mu sync.Mutex
	ran := map[once.Key]int{}
	effect := func(_ context.Context, a once.Attempt) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		ran[a.Key]++
		return "sent", nil
	}
	s, spec := newStore(t, h)
	other, err := h.Open(ctx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore(other) })
	// Each reaper's first hook waits (a while at most) until the other's
	// hook has been called too, so both passes have listed what waits
	// before either goes on.
	entered := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var firsts [2]sync.Once
	var hooked [2]int
	clients := make([]*once.Client, 2)
	for i, st := range []once.Store{s, other} {
		pol := once.KindPolicy{RedriveAfter: after, Redrive: func(ctx context.Context, a once.Action) error {
			mu.Lock()
			hooked[i]++
			mu.Unlock()
			firsts[i].Do(func() {
				close(entered[i])
				select {
				case <-entered[1-i]:
				case <-time.After(5 * time.Second):
				}
			})
			_, err := once.Do(ctx, clients[i], intent(a.Step), effect, once.WaitFor(5*time.Second))
			return err
		}}
		c, err := once.New(once.Config{Store: st, Kinds: map[string]once.KindPolicy{"send_email": pol}})
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	for i := range n {
		_, err := once.Do(ctx(t), clients[0], intent(int64(i)), func(context.Context, once.Attempt) (string, error) {
			return "", once.RetryLater(errors.New("421 try again later"))
		})
		if !errors.Is(err, once.ErrRetryLater) {
			t.Fatalf("step %d: Do = %v, want it released", i, err)
		}
	}
	time.Sleep(after + 100*time.Millisecond)
	var wg sync.WaitGroup
	reps := make([]once.ReapReport, 2)
	for i, c := range clients {
		wg.Go(func() {
			r, err := once.NewReaper(c, once.ReaperConfig{})
			if err != nil {
				t.Error(err)
				return
			}
			if reps[i], err = r.RunOnce(ctx(t)); err != nil {
				t.Errorf("reaper %d: %v", i+1, err)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if got := reps[0].Redriven + reps[1].Redriven; got != n {
		t.Errorf("the reapers counted %d and %d re-driven, %d in all; want %d, one per action", reps[0].Redriven, reps[1].Redriven, got, n)
	}
	if got := hooked[0] + hooked[1]; got != n {
		t.Errorf("Redrive was called %d times (%d and %d); want %d, once per action", got, hooked[0], hooked[1], n)
	}
	for i := range n {
		k := keyOf(t, intent(int64(i)))
		if ran[k] != 1 {
			t.Errorf("step %d: the effect ran %d times, want once", i, ran[k])
		}
		if a := mustGet(t, s, k); a.Status != once.StatusSucceeded || a.Attempt != 2 {
			t.Errorf("step %d: stored %s at attempt %d, want succeeded at 2", i, a.Status, a.Attempt)
		}
		if tr := trail(t, s, k); !strings.HasSuffix(tr, ",released,redriven,claimed,succeeded") || strings.Count(tr, "redriven") != 1 {
			t.Errorf("step %d: trail %s; want one redriven event, before the hook's claim", i, tr)
		}
	}
}

// Transition.Waiting applies a transition only while the action waits
// for a delivery (Filter.Waiting): a mark of a row released a moment ago
// is refused, the first mark of a row that waited applies, and a second
// mark right after it, as a second reaper's would be, is refused. Without
// Waiting, the fence is the attempt and the status alone.
func testTransitionWaiting(t *testing.T, h Harness) {
	s, _ := newStore(t, h)
	const after = 200 * time.Millisecond
	release := func(step int64) once.Key {
		req := claimReq(t, intent(step), time.Hour)
		req.RedriveAfter = after
		k := mustClaim(t, s, req).Action.Key
		settle(t, s, k, once.StatusReleased)
		return k
	}
	mark := func(k once.Key, waiting bool) bool {
		t.Helper()
		ok, err := s.Transition(ctx(t), once.Transition{Key: k, Attempt: 1, From: []once.Status{once.StatusReleased}, To: once.StatusReleased,
			Waiting: waiting, Token: "m", Event: once.Event{Key: k, Type: once.EventRedriven, Attempt: 1, From: once.StatusReleased, Actor: once.ActorReaper}})
		if err != nil {
			t.Fatalf("Transition: %v", err)
		}
		return ok
	}
	waited := release(1)
	time.Sleep(after + 50*time.Millisecond)
	fresh := release(2)
	if mark(fresh, true) {
		t.Error("a mark fenced by Waiting applied to an action released a moment ago")
	}
	if !mark(waited, true) {
		t.Fatal("a mark fenced by Waiting was refused on an action that waited past its RedriveAfter")
	}
	if mark(waited, true) {
		t.Error("a second mark fenced by Waiting applied right after the first: two reapers would both re-drive it")
	}
	if tr := trail(t, s, waited); strings.Count(tr, "redriven") != 1 {
		t.Errorf("trail %s; want one redriven event", tr)
	}
	if !mark(fresh, false) {
		t.Error("a mark without Waiting was refused on a released action")
	}
}
