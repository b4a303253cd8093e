package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oncehq/once"
)

// edgeTests are the partial-failure edges: late outcomes, lost replies,
// hung connections.
func edgeTests() []namedTest {
	return []namedTest{
		{"LateSuccessAfterRelease", testLateSuccessAfterRelease},
		{"LateSuccessAfterPersonRetry", testLateSuccessAfterPersonRetry},
		{"LateSuccessAfterAbandon", testLateSuccessAfterAbandon},
		{"SlowVerifierOneReaperPerAction", testSlowVerifierOneReaperPerAction},
		{"ReleasedActionIsRedriven", testReleasedActionIsRedriven},
	}
}

// lateSuccess checks what every late-success case must end with: the
// worker's outcome recorded for attempt 1, its result replayed to the
// next delivery without running the effect, and the trail showing both
// the decision and the late outcome.
func lateSuccess(t *testing.T, s once.Store, c *once.Client, resume func() string, wantTrail string) {
	t.Helper()
	if out := resume(); out != "executed" {
		t.Fatalf("the slow worker said %q, want its completion recorded", out)
	}
	a := mustGet(t, s, processKey())
	if a.Status != once.StatusSucceeded || a.Attempt != 1 {
		t.Fatalf("stored %s attempt %d; the outcome became known and must be recorded", a.Status, a.Attempt)
	}
	res, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) {
		t.Error("the next delivery ran the effect again")
		return 0, nil
	})
	if err != nil || !res.Replayed || res.Attempt != 1 {
		t.Fatalf("next delivery = %+v, %v; want attempt 1 replayed", res, err)
	}
	if got := trail(t, s, a.Key); got != wantTrail {
		t.Fatalf("trail %s, want %s", got, wantTrail)
	}
}

// Recovery released the claim (its worker looked dead); the worker then
// reports success before anyone claimed again.
func testLateSuccessAfterRelease(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.RetryWithProviderKey}))
	_, resume := zombie(t, s, spec)
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Released != 1 {
		t.Fatalf("reaper = %+v, %v; want the dead claim released", rep, err)
	}
	lateSuccess(t, s, c, resume, "claimed,released,succeeded")
}

// A person chose Retry on the review item; the worker then reports.
func testLateSuccessAfterPersonRetry(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.AskPerson}))
	_, resume := zombie(t, s, spec)
	if _, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return 0, nil }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("redelivery = %v, want review", err)
	}
	if _, err := c.Resolve(ctx(t), processKey(), once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "no trace in the mail log"}); err != nil {
		t.Fatal(err)
	}
	lateSuccess(t, s, c, resume, "claimed,review,resolved,succeeded")
}

// A person abandoned the action; the worker then reports that it did
// happen after all.
func testLateSuccessAfterAbandon(t *testing.T, h Harness) {
	s, c, spec := setup(t, h, policyConfig(once.KindPolicy{Recovery: once.AskPerson}))
	_, resume := zombie(t, s, spec)
	if _, err := once.Do(ctx(t), c, processIntent, func(context.Context, once.Attempt) (int, error) { return 0, nil }); !errors.Is(err, once.ErrReview) {
		t.Fatalf("redelivery = %v, want review", err)
	}
	if _, err := c.Resolve(ctx(t), processKey(), once.Resolution{Decision: once.DecisionAbandon, By: "ada", Note: "customer cancelled"}); err != nil {
		t.Fatal(err)
	}
	lateSuccess(t, s, c, resume, "claimed,review,resolved,succeeded")
}

// A reaper whose verifier is slow must not hold its whole batch while it
// asks about each action in turn: the tail's hold would run out, and a
// second reaper would ask about the same actions again. Each action is
// held when it is decided, so every verifier is asked exactly once.
func testSlowVerifierOneReaperPerAction(t *testing.T, h Harness) {
	const n = 6
	var mu sync.Mutex
	asked := map[once.Key]int{}
	pol := once.KindPolicy{Recovery: once.VerifyThenDecide, Lease: 40 * time.Millisecond, MaxExecution: 120 * time.Millisecond,
		Verifier: func(ctx context.Context, a once.Action) (bool, json.RawMessage, error) {
			mu.Lock()
			asked[a.Key]++
			mu.Unlock()
			time.Sleep(100 * time.Millisecond) // slow, but within MaxExecution
			return true, json.RawMessage(`"found"`), nil
		}}
	s, c1, spec := setup(t, h, once.Config{Default: pol})
	other, err := h.Open(ctx(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore(other) })
	c2, err := once.New(once.Config{Store: other, Default: pol})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		in := once.Intent{Run: "slow", Step: int64(i), Kind: "post_message"}
		if _, err := s.Claim(ctx(t), claimReq(t, in, time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	var wg sync.WaitGroup
	for i, c := range []*once.Client{c1, c2} {
		wg.Go(func() {
			// The second reaper starts once the first one's hold on a
			// whole batch would have run out.
			time.Sleep(time.Duration(i) * 250 * time.Millisecond)
			r, _ := once.NewReaper(c, once.ReaperConfig{})
			if _, err := r.RunOnce(ctx(t)); err != nil {
				t.Errorf("reaper %d: %v", i+1, err)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != n {
		t.Fatalf("the verifier was asked about %d actions, want %d", len(asked), n)
	}
	for k, times := range asked {
		if times != 1 {
			t.Errorf("action %s: the verifier was asked %d times; two reapers handled it", k, times)
		}
	}
	for i := range n {
		if a := mustGet(t, s, keyOf(t, once.Intent{Run: "slow", Step: int64(i), Kind: "post_message"})); a.Status != once.StatusSucceeded {
			t.Errorf("step %d is %s, want succeeded", i, a.Status)
		}
	}
}

// A person chose Retry on a review item whose job was dropped long ago:
// nobody will deliver it again, so the reaper hands it to the kind's
// Redrive hook (once per RedriveAfter), and the re-driven job runs it. A
// kind with no hook is counted as waiting.
func testReleasedActionIsRedriven(t *testing.T, h Harness) {
	var mu sync.Mutex
	var redriven []once.Action
	pol := once.KindPolicy{RedriveAfter: 50 * time.Millisecond, Redrive: func(_ context.Context, a once.Action) error {
		mu.Lock()
		defer mu.Unlock()
		redriven = append(redriven, a)
		return nil
	}}
	s, c, _ := setup(t, h, once.Config{Kinds: map[string]once.KindPolicy{"send_email": pol, "no_hook": {RedriveAfter: 50 * time.Millisecond}}})
	review := func(in once.Intent) once.Key {
		if _, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (int, error) { return 0, errors.New("timeout after DATA") }); !errors.Is(err, once.ErrReview) {
			t.Fatalf("Do = %v, want review", err)
		}
		k := keyOf(t, in)
		if _, err := c.Resolve(ctx(t), k, once.Resolution{Decision: once.DecisionRetry, By: "ada", Note: "bounced; send again"}); err != nil {
			t.Fatal(err)
		}
		return k
	}
	in := intent(1)
	k := review(in)
	review(once.Intent{Run: "r", Kind: "no_hook"})
	r, err := once.NewReaper(c, once.ReaperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx(t)); err != nil || rep.Redriven != 0 || rep.Waiting != 0 {
		t.Fatalf("a pass before RedriveAfter = %+v, %v; want nothing re-driven yet", rep, err)
	}
	time.Sleep(80 * time.Millisecond)
	rep, err := r.RunOnce(ctx(t))
	if err != nil || rep.Redriven != 1 || rep.Waiting != 1 {
		t.Fatalf("pass = %+v, %v; want one re-driven and one waiting with no hook", rep, err)
	}
	if rep, _ := r.RunOnce(ctx(t)); rep.Redriven != 0 {
		t.Fatalf("re-driven again at once: %+v", rep)
	}
	mu.Lock()
	got := append([]once.Action(nil), redriven...)
	mu.Unlock()
	if len(got) != 1 || got[0].Key != k || got[0].Run != in.Run || got[0].Status != once.StatusReleased {
		t.Fatalf("Redrive got %+v", got)
	}
	if tr := trail(t, s, k); tr != "claimed,review,resolved,redriven" {
		t.Fatalf("trail %s", tr)
	}
	// The re-driven job is delivered: it runs as attempt 2.
	res, err := once.Do(ctx(t), c, in, func(context.Context, once.Attempt) (string, error) { return "sent", nil })
	if err != nil || res.Attempt != 2 || res.Value != "sent" {
		t.Fatalf("re-driven delivery = %+v, %v", res, err)
	}
}
